"""python3-boto3 transfers of a folder to and from S3, the baseline of tools/bench/s3_bench.sh.

  boto3_transfer.py ENDPOINT mkbucket BUCKET
  boto3_transfer.py ENDPOINT upload DIR BUCKET PREFIX      # every file under DIR (upload_file)
  boto3_transfer.py ENDPOINT download BUCKET PREFIX DIR    # every object under PREFIX/ (download_file)
  boto3_transfer.py ENDPOINT delete BUCKET PREFIX          # every object under PREFIX/

Credentials come from the AWS environment variables. Transfers use boto3's default
TransferConfig (multipart above 8 MiB, 8 MiB parts, 10 threads), as users call it.
"""
import os
import sys

import boto3
from botocore.config import Config


def client(endpoint):
    return boto3.client("s3", endpoint_url=endpoint,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 6}))


def keys_under(s3, bucket, prefix):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            yield item["Key"]


def main(endpoint, command, *args):
    s3 = client(endpoint)
    if command == "mkbucket":
        s3.create_bucket(Bucket=args[0])
    elif command == "upload":
        folder, bucket, prefix = args
        for parent, dirs, files in os.walk(folder):  # subfolders too (a DeepSpeed save)
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(parent, name)
                s3.upload_file(path, bucket, f"{prefix}/{os.path.relpath(path, folder)}")
    elif command == "download":
        bucket, prefix, folder = args
        os.makedirs(folder, exist_ok=True)
        for key in keys_under(s3, bucket, prefix):
            path = os.path.join(folder, key[len(prefix) + 1:])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            s3.download_file(bucket, key, path)
    elif command == "delete":
        bucket, prefix = args
        for key in list(keys_under(s3, bucket, prefix)):
            s3.delete_object(Bucket=bucket, Key=key)
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main(*sys.argv[1:])
