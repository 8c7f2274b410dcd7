//! Streaming SHA-256: hash (and optionally copy) a reader in fixed chunks so
//! memory never grows with file size. No path handling lives here.

use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};

/// Size of the buffer every stream goes through.
pub const CHUNK: usize = 256 * 1024;

/// The digest and byte count of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashed {
    /// `sha256:<64 lowercase hex>`.
    pub sha256: String,
    pub size: u64,
}

/// Formats a finished hasher as `sha256:<hex>`.
pub fn format_digest(hasher: Sha256) -> String {
    let bytes = hasher.finalize();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in bytes.iter() {
        out.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    out
}

/// Hashes `bytes` held in memory.
pub fn hash_bytes(bytes: &[u8]) -> Hashed {
    let mut hasher = Sha256::new();
    hasher.update(bytes);
    Hashed {
        sha256: format_digest(hasher),
        size: bytes.len() as u64,
    }
}

/// Reads `reader` to the end, hashing every byte and writing it to `sink`
/// when one is given. Reads at most `limit + 1` bytes when a limit is set, so
/// a file that grew past its declared size is noticed without reading it all.
pub fn copy_hashed(
    reader: &mut dyn Read,
    mut sink: Option<&mut dyn Write>,
    limit: Option<u64>,
) -> io::Result<Hashed> {
    let mut hasher = Sha256::new();
    // A small file needs no 256 KiB buffer (zeroing it would cost more
    // than reading the file).
    let len = limit.map_or(CHUNK, |l| {
        usize::try_from(l.saturating_add(1))
            .unwrap_or(CHUNK)
            .clamp(4096, CHUNK)
    });
    let mut buf = vec![0u8; len];
    let mut size: u64 = 0;
    loop {
        let want = match limit {
            Some(limit) => {
                let left = (limit + 1).saturating_sub(size);
                if left == 0 {
                    break;
                }
                buf.len().min(usize::try_from(left).unwrap_or(usize::MAX))
            }
            None => buf.len(),
        };
        // A stop request ends even a terabyte-sized read within one chunk.
        crate::runtime::interrupt::check_entered()?;
        let n = match reader.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        crate::runtime::progress::add_bytes(n as u64);
        if let Some(sink) = sink.as_mut() {
            sink.write_all(&buf[..n])?;
        }
        size += n as u64;
    }
    crate::runtime::progress::file_done();
    Ok(Hashed {
        sha256: format_digest(hasher),
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest_of_empty_and_abc() {
        assert_eq!(
            hash_bytes(b"").sha256,
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hash_bytes(b"abc").sha256,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn copy_matches_in_memory_hash_across_chunks() {
        let data: Vec<u8> = (0..(CHUNK * 2 + 17)).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        let got = copy_hashed(&mut &data[..], Some(&mut out), None).unwrap();
        assert_eq!(got, hash_bytes(&data));
        assert_eq!(out, data);
    }

    #[test]
    fn limit_stops_one_byte_past_the_declared_size() {
        let data = vec![7u8; 1000];
        let got = copy_hashed(&mut &data[..], None, Some(10)).unwrap();
        assert_eq!(got.size, 11);
    }
}
