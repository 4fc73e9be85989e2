#!/usr/bin/python3
"""What 105-pause-delta reads in S3 (Swift s3api): a paused session's
manifest and the objects under its prefix.
  s3_layers.py fields MANIFEST_KEY  -> "version depth tail nstate"
  s3_layers.py orphans PREFIX       -> objects under PREFIX that its
                                       manifest.json does not name (one a line;
                                       a session's, a snapshot's or a volume's)
  s3_layers.py count PREFIX         -> how many objects are under PREFIX
  s3_layers.py damage MANIFEST_KEY  -> flips a byte of its first state chunk
                                       (a volume's: its first chunk)
  s3_layers.py prefixes MANIFEST_KEY -> the distinct prefixes (up to the
                                       id) its chunks are under
Environment: S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY, BUCKET."""
import json, os, sys

import boto3
from botocore.config import Config

s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"],
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
B = os.environ["BUCKET"]


def manifest(key):
    return json.loads(s3.get_object(Bucket=B, Key=key)["Body"].read())


def keys(prefix):
    out, tok = [], None
    while True:
        kw = {"Bucket": B, "Prefix": prefix}
        if tok:
            kw["ContinuationToken"] = tok
        r = s3.list_objects_v2(**kw)
        out += [o["Key"] for o in r.get("Contents", [])]
        if not r.get("IsTruncated"):
            return out
        tok = r["NextContinuationToken"]


op, arg = sys.argv[1], sys.argv[2]
if op == "fields":
    m = manifest(arg)
    print(m["version"], m.get("depth", "-"), m.get("tail", "-"), len(m["state"]["chunks"]))
elif op == "orphans":
    m = manifest(arg + "manifest.json")
    # A session's or snapshot's (state, disk) or a volume's (chunks).
    named = {c["key"] for part in ("state", "disk") if part in m for c in m[part]["chunks"]}
    named |= {c["key"] for c in m.get("chunks", []) if isinstance(m.get("chunks"), list)}
    for k in keys(arg):
        if k != arg + "manifest.json" and k not in named:
            print(k)
elif op == "count":
    print(len(keys(arg)))
elif op == "damage":
    m = manifest(arg)
    k = (m["state"]["chunks"] if "state" in m else m["chunks"])[0]["key"]
    b = bytearray(s3.get_object(Bucket=B, Key=k)["Body"].read())
    b[len(b) // 2] ^= 0xFF
    s3.put_object(Bucket=B, Key=k, Body=bytes(b))
elif op == "prefixes":
    m = manifest(arg)
    print(" ".join(sorted({"/".join(c["key"].split("/")[:3]) for part in ("state", "disk")
                           for c in m[part]["chunks"]})))
