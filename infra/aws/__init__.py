"""CDK constructs and the stack for the AWS control plane."""
