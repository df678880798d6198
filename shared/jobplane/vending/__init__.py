"""The credential vending functions' work, one module per cloud (their thin handlers are functions/aws/vend.py
and functions/gcp/main.py's `vend`): prove who asks, let `jobplane.decide.vend` answer, mint credentials
narrowed to the job's keys. `aws_iam` holds the AWS policies as JSON, shared by the CDK and the local cloud."""
