//! Collective communication between the ranks of a worker group.
