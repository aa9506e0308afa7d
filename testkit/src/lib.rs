//! Test helpers for tests that need a real Kubernetes API server.
