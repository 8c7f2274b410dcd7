//! The s3 maintenance logic against `object_store`'s in-memory store,
//! which has the same conditional semantics as S3.
