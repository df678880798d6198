"""AWS Lambda handlers."""
