#!/usr/bin/env bash
# A real Slurm cluster on this one host, for tests/slurm and for trying the sbatch templates.
# Debian 12 (slurm-wlm 22.05 + munge), run as root, no systemd needed. Every node is a virtual
# node (n1..nN, one slurmd each, all on 127.0.0.1), so multi-node jobs and the rendezvous work.
#
#   eval "$(scripts/slurm_local.sh up)"    install if missing, start, wait for idle nodes, print SLURM_CONF
#   scripts/slurm_local.sh down            cancel jobs, stop only the daemons this script started
#   scripts/slurm_local.sh install         only install the packages (apt-get) when they are missing
#
# Knobs: SLURM_LOCAL_DIR (default /tmp/clip-slurm), SLURM_LOCAL_NODES (2), SLURM_LOCAL_CPUS (nproc),
#        SLURM_LOCAL_PORT (6817; slurmd i listens on PORT+i), SLURM_LOCAL_TIMEOUT (60 s).
set -euo pipefail

DIR=${SLURM_LOCAL_DIR:-/tmp/clip-slurm}
NODES=${SLURM_LOCAL_NODES:-2}
CPUS=${SLURM_LOCAL_CPUS:-$(nproc)}
PORT=${SLURM_LOCAL_PORT:-6817}
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}
export SLURM_CONF=$DIR/etc/slurm.conf

log() { echo "[slurm_local] $*" >&2; }
die() { log "error: $*"; exit 1; }

# PIDs come only from our own pid files; the command name is checked so a reused PID is left alone.
running() { [ -n "$1" ] && grep -qs "$2" "/proc/$1/cmdline" && [ "$(awk '{print $3}' "/proc/$1/stat")" != Z ]; }
stop() {  # stop PIDFILE NAME
  local pid
  pid=$(cat "$1" 2>/dev/null || true)
  if running "$pid" "$2"; then
    kill -TERM "$pid"
    for _ in $(seq 50); do running "$pid" "$2" || break; sleep 0.2; done
    running "$pid" "$2" && kill -KILL "$pid"
  fi
  rm -f "$1"
}

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null && return 0
  log "installing slurmctld slurmd slurm-client munge with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
start_munge() {
  munge_ok && return 0
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key --force
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
  chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
  munge_ok || die "munged did not start; see /var/log/munge/munged.log"
  cp /run/munge/munged.pid "$DIR/run/munged.pid"
}

write_conf() {
  local mem i
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  mkdir -p "$DIR/etc" "$DIR/state" "$DIR/run" "$DIR/log"
  cat >"$SLURM_CONF" <<EOF
ClusterName=clipci
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=cred_expire=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/state/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1,bf_interval=1
SlurmdParameters=config_overrides
MailProg=/bin/true
EnforcePartLimits=ALL
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
KillWait=5
EOF
  for i in $(seq "$NODES"); do
    echo "NodeName=n$i NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 Port=$((PORT + i))" \
      "CPUs=$CPUS RealMemory=$((mem / NODES))" >>"$SLURM_CONF"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$SLURM_CONF"
}

nodes_idle() {
  local states
  states=$(sinfo -h -N -o %T 2>/dev/null) || return 1
  [ "$(grep -c . <<<"$states")" -eq "$NODES" ] && ! grep -qvE '^(idle|mixed|allocated)$' <<<"$states"
}

up() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  install
  down 2>/dev/null
  rm -rf "$DIR/state"
  write_conf
  start_munge
  slurmctld -f "$SLURM_CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
  for i in $(seq "$NODES"); do slurmd -f "$SLURM_CONF" -N "n$i" || die "slurmd n$i did not start"; done
  local t0=$SECONDS
  until nodes_idle; do
    if ((SECONDS - t0 > TIMEOUT)); then
      sinfo -N >&2 || true
      tail -n 20 "$DIR"/log/*.log >&2
      die "nodes not idle after ${TIMEOUT}s"
    fi
    sleep 0.3
  done
  log "up: $(sinfo -h -o '%P %D %T %N')"
  echo "export SLURM_CONF=$SLURM_CONF"
}

down() {
  local f
  if running "$(cat "$DIR/run/slurmctld.pid" 2>/dev/null || true)" slurmctld; then
    squeue -h -o %i | xargs -r scancel || true
    for _ in $(seq 50); do [ -z "$(squeue -h -o %i)" ] && break; sleep 0.2; done
  fi
  for f in "$DIR"/run/slurmd-*.pid; do [ -e "$f" ] && stop "$f" slurmd; done
  stop "$DIR/run/slurmctld.pid" slurmctld
  stop "$DIR/run/munged.pid" munged
  log "down"
}

case "${1:-}" in
  install) [ "$(id -u)" = 0 ] || die "must run as root"; install ;;
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "usage: $0 up|down|install|env" >&2; exit 2 ;;
esac
