"""Writes a JWKS (one Ed25519 key of its own) and lease JWTs signed with it,
as the cluster signs them, for bench/pgfence/run.sh: COPY lines
`n<TAB>lease<TAB>token<TAB>jwt` on stdout, the JWKS to the file argv[1].
Leases: bench-1..1000 (n = their number), bench-one (n = 0),
bench-c0..255 (n = 10000 + i), and fresh-0..19 (n = 20000 + i, left
unproven: a first verification). Token 1, exp a day away."""

import base64
import json
import sys
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


key = Ed25519PrivateKey.generate()
public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
kid = "bench"
with open(sys.argv[1], "w") as out:
    json.dump({"keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": kid,
                         "x": b64(public)}], "applied_index": 1}, out)
header = b64(json.dumps({"typ": "JWT", "alg": "EdDSA", "kid": kid}, separators=(",", ":")).encode())
now = int(time.time())
leases = [(i, f"bench-{i}") for i in range(1, 1001)] + [(0, "bench-one")]
leases += [(10000 + i, f"bench-c{i}") for i in range(256)]
leases += [(20000 + i, f"fresh-{i}") for i in range(20)]
for n, lease in leases:
    claims = {"iss": "palisade", "sub": "bench", "lease": lease, "token": 1, "iat": now, "exp": now + 86400}
    signed = header + "." + b64(json.dumps(claims, separators=(",", ":")).encode())
    print(f"{n}\t{lease}\t1\t{signed}.{b64(key.sign(signed.encode()))}")
