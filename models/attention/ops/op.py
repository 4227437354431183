"""What a linear op is, as the kernels it shares with the other ops see it: one `Op` per op, in its folder's
__init__.py. Shared code (causal.py, normalised.py, causal_cpu.py and .c, triton_common.py) takes the Op and reads
its fields; it never tests an op's name.

    sim(q_i, k_n) = 1 + q^_i . k^_n           unit features: q^ = q / |q| per head (the affine ops)
                  = phi(q_i) . phi(k_n)       otherwise, phi = elu + 1 (Katharopoulos et al. 2020)
                  = (q_i e_i) . (k_n / e_n)   raw features (the decay families' one-chunk causal form on
                                              causal_cpu.c: e = e^b, b the cumulative log decay, or 1)
    o_i = sum_n sim_in v_n / sum_n sim_in      normalised
        = sum_n sim_in v_n / 2                  not normalised (Gerami et al. 2026, Eq. 7)
        = sum_n sim_in v_n                      raw

with n over the real keys (n <= i when causal).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    name: str  # the one name: the registry's, the config's, the folder's
    unit: bool  # unit features and sim = 1 + q^.k^ (else phi = elu + 1 and sim = phi(q).phi(k))
    normalised: bool  # divided by the sum of the weights (else the halved sum of Eq. 7)
    raw: bool = False  # features as given, no elu + 1 (only with unit False; causal_cpu.py alone reads it)

    def __str__(self) -> str:
        return self.name
