"""The launcher tests use tests/conftest.py's moto_aws (in-process S3 + EC2 with a registry)."""
