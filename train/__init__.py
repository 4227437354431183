"""Training: `python -m train CONFIG.yaml [key=value ...]` (see train/main.py)."""
