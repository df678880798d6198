# What type checkers see of the jobplane package: __init__.py imports the SDK only when Client is first read.
from jobplane.sdk import Client as Client

__version__: str
__all__ = ["Client", "__version__"]
