//! Bundle manifests, verification and sealing (being written).
