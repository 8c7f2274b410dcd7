//! Configuration (being written).
