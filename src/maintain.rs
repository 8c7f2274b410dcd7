//! Catalog maintenance (being written).
