"""Deployment code: infra/aws (CDK, Python) and infra/gcp (Terraform)."""
