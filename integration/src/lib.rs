//! Helpers for bufscope integration tests.
