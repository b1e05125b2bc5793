"""The browser tests (make browser-test): a package, so that its
conftest.py does not shadow the unit tests' own (both would be
imported as the module ``conftest``)."""
