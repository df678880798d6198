"""The local cloud: fakes and runners for `make demo` and tests."""
