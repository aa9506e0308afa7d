//! The test kit's integration tests against the real control plane (`make test-cluster`), one
//! binary: the kit itself (`cluster`) and the TrainingJob CRD's rules in the API server (`cel`).

mod cel;
mod cluster;
