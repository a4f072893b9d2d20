"""A small task of the kind an agent writes: compute, print, write a file."""
import json
import sys

import numpy as np

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
sieve = np.ones(n + 1, dtype=bool)
sieve[:2] = False
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i :: i] = False
primes = np.flatnonzero(sieve).tolist()
print(f"{len(primes)} primes below {n}; the largest is {primes[-1]}")
with open("primes.json", "w") as f:
    json.dump(primes, f)
