//! Integration tests: run the real binary in temporary folders.
