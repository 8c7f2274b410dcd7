//! Requests the object-store intake makes (docs/contract.md §22) beside a
//! destination's: listing one level of "folders", reading small objects
//! whole, streaming an object into a file while hashing it, and copying
//! server-side. None of these writes a destination's output; the writes
//! an intake makes (its lease, its results) go through the conditional
//! [`S3Root::put_new`] and [`S3Root::put_replace`].

use super::{ETag, Error, Listed, Result, S3Root, failure, to_time};
use crate::fs::hashing::Hashed;
use object_store::{GetOptions, ObjectStore as _, ObjectStoreExt as _};
use std::io::Write;
use time::OffsetDateTime;

/// How many objects [`S3Root::get_many_into`] reads at once.
pub const GETS_IN_FLIGHT: usize = 8;

/// One level of a listing with `/` as the delimiter.
#[derive(Debug, Default)]
pub struct Level {
    /// The names of the "folders" right below the prefix (no slash).
    pub folders: Vec<String>,
    /// The objects right below the prefix, keys relative to the root.
    pub objects: Vec<Listed>,
}

/// A small object read whole.
#[derive(Debug)]
pub struct Small {
    pub bytes: Vec<u8>,
    pub etag: ETag,
    pub last_modified: OffsetDateTime,
}

/// Whether `e` is an answer the s3 client could not make sense of: in a
/// listing, a key that is no path it takes (a control character; an
/// empty, `.` or `..` segment), which its own reader then lists
/// ([`S3Root::list_raw`]).
pub fn unparsed(e: &Error) -> bool {
    matches!(
        e,
        Error::Store {
            failure: super::Failure::Other,
            ..
        }
    )
}

/// A key before every key that starts with `start`, and after as few
/// others as can be: `start` with its last character one lower and
/// U+10FFFF after it (or, when the one lower is no character a key
/// takes, without its last character, and a space after a `/` then at
/// its end). Not `start` itself: SeaweedFS compares
/// `start-after` with the names of each folder, so that after `x` it
/// leaves out the folder `x/` (S3 compares whole keys, and keeps it).
fn just_before(start: &str) -> String {
    let mut chars = start.chars();
    let Some(last) = chars.next_back() else {
        return String::new();
    };
    let head = chars.as_str();
    match (last as u32).checked_sub(1).and_then(char::from_u32) {
        Some(lower) if !lower.is_control() && lower != '/' => format!("{head}{lower}\u{10FFFF}"),
        // Not a key ending in `/`, which the client would cut (out of
        // the folder listed): a space sorts before every name character.
        _ if head.ends_with('/') => format!("{head} "),
        _ => head.to_owned(),
    }
}

/// The key prefix the s3 client lists below `folder`: "" or `folder/`.
fn raw_prefix(folder: Option<&object_store::path::Path>) -> String {
    folder.map(|p| format!("{p}/")).unwrap_or_default()
}

impl S3Root {
    /// The full key of folder `rel` ("" = the root) with a trailing slash.
    fn folder_key(&self, rel: &str) -> Option<object_store::path::Path> {
        let joined = match (self.prefix.is_empty(), rel.is_empty()) {
            (true, true) => return None,
            (true, false) => rel.to_owned(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{rel}", self.prefix),
        };
        Some(super::object_path(&joined))
    }

    fn relative(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            let strip = format!("{}/", self.prefix);
            key.strip_prefix(&strip).unwrap_or(key).to_owned()
        }
    }

    /// The folders and objects right below `rel` (one LIST request per
    /// thousand entries; a folder's contents are not listed).
    pub fn list_level(&self, rel: &str) -> Result<Level> {
        let prefix = self.folder_key(rel);
        let listed = self.block_on(self.store.list_with_delimiter(prefix.as_ref()));
        let mut level = Level::default();
        match listed.map_err(|e| self.store_err("LIST", rel, e)) {
            Ok(listed) => {
                for p in listed.common_prefixes {
                    if let Some(name) = p.filename() {
                        level.folders.push(name.to_owned());
                    }
                }
                for meta in listed.objects {
                    level.objects.push(Listed {
                        path: self.relative(meta.location.as_ref()),
                        size: meta.size,
                        last_modified: to_time(meta.last_modified),
                        etag: meta.e_tag,
                    });
                }
            }
            Err(e) if unparsed(&e) => {
                let below = raw_prefix(prefix.as_ref());
                log::debug!(
                    "{}: LIST {rel}: {e}; listed by this agent's own reader",
                    self.label
                );
                let raw = self.block_on(self.list_raw(&below, true, usize::MAX))?;
                let raw = raw.unwrap_or_default();
                for p in raw.prefixes {
                    let name = p.strip_prefix(&below).unwrap_or(&p);
                    level
                        .folders
                        .push(name.strip_suffix('/').unwrap_or(name).to_owned());
                }
                for mut o in raw.objects {
                    o.path = self.relative(&o.path);
                    level.objects.push(o);
                }
            }
            Err(e) => return Err(e),
        }
        level.folders.sort();
        level.folders.dedup();
        level.objects.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(level)
    }

    /// The objects below `rel` (at any depth), at most `most` of them;
    /// `None` when there are more (the listing stops there: a prefix with
    /// millions of objects costs one page, not millions of entries).
    pub fn list_at_most(&self, rel: &str, most: usize) -> Result<Option<Vec<Listed>>> {
        self.block_on(self.list_at_most_async(rel, most))
    }

    /// The objects below `rel` whose keys (relative to the root) start
    /// with `start`: one LIST from just before them (`start-after`), a
    /// page per thousand of them, and no page past them.
    pub fn list_starting(&self, rel: &str, start: &str) -> Result<Vec<Listed>> {
        use futures_util::StreamExt as _;
        let prefix = self.folder_key(rel);
        let start = self.key(start);
        let start = start.as_ref();
        let offset = super::object_path(&just_before(start));
        let (listed, answer) = self.block_on(failure::answered(async {
            let mut out = Vec::new();
            let mut stream = self.store.list_with_offset(prefix.as_ref(), &offset);
            while let Some(meta) = stream.next().await {
                let meta = meta?;
                let key = meta.location.as_ref();
                if !key.starts_with(start) {
                    if key < start {
                        continue;
                    }
                    break;
                }
                out.push(Listed {
                    path: self.relative(meta.location.as_ref()),
                    size: meta.size,
                    last_modified: to_time(meta.last_modified),
                    etag: meta.e_tag,
                });
            }
            Ok::<_, object_store::Error>(out)
        }));
        listed.map_err(|e| self.store_failed("LIST", start, &e, answer))
    }

    /// The bytes of `rel`, `None` when it does not exist, an error when it
    /// holds more than `most` bytes (read no further than that).
    pub fn get_small(&self, rel: &str, most: u64) -> Result<Option<Small>> {
        self.block_on(self.get_small_async(rel, most))
    }

    /// [`S3Root::list_at_most`] of `(rel, most)` and [`S3Root::get_small`]
    /// of `small`, side by side (one round trip, not two).
    pub fn list_and_get_small(
        &self,
        (rel, most): (&str, usize),
        small: (&str, u64),
    ) -> (Result<Option<Vec<Listed>>>, Result<Option<Small>>) {
        self.block_on(async {
            futures_util::join!(
                self.list_at_most_async(rel, most),
                self.get_small_async(small.0, small.1)
            )
        })
    }

    async fn list_at_most_async(&self, rel: &str, most: usize) -> Result<Option<Vec<Listed>>> {
        use futures_util::StreamExt as _;
        let prefix = self.folder_key(rel);
        let (listed, answer) = failure::answered(async {
            let mut out = Vec::new();
            let mut stream = self.store.list(prefix.as_ref());
            while let Some(meta) = stream.next().await {
                let meta = meta?;
                if out.len() == most {
                    return Ok(None);
                }
                out.push(Listed {
                    path: self.relative(meta.location.as_ref()),
                    size: meta.size,
                    last_modified: to_time(meta.last_modified),
                    etag: meta.e_tag,
                });
            }
            Ok::<_, object_store::Error>(Some(out))
        })
        .await;
        let mut listed = match listed.map_err(|e| self.store_failed("LIST", rel, &e, answer)) {
            Err(e) if unparsed(&e) => {
                log::debug!(
                    "{}: LIST {rel}: {e}; listed by this agent's own reader",
                    self.label
                );
                let raw = self
                    .list_raw(&raw_prefix(prefix.as_ref()), false, most)
                    .await?;
                raw.map(|raw| {
                    raw.objects
                        .into_iter()
                        .map(|mut o| {
                            o.path = self.relative(&o.path);
                            o
                        })
                        .collect()
                })
            }
            listed => listed?,
        };
        if let Some(l) = &mut listed {
            l.sort_by(|a, b| a.path.cmp(&b.path));
        }
        Ok(listed)
    }

    /// Reads each of `rels` as [`S3Root::get_small`] does, up to
    /// [`super::HEADS_IN_FLIGHT`] at once, and hands it to `each` with its
    /// index, in order; except that an object of more than `most` bytes
    /// is no error: its `bytes` are then its first `most + 1` (its version
    /// and `Last-Modified` are what the caller wants of it). Only the
    /// objects in flight are in memory, besides what `each` keeps. An
    /// object whose read fails goes to `each` as that failure; the reads
    /// go on while `each` returns true.
    pub fn get_small_each(
        &self,
        rels: &[&str],
        most: u64,
        mut each: impl FnMut(usize, Result<Option<Small>>) -> bool,
    ) {
        use futures_util::StreamExt as _;
        self.block_on(async {
            let mut got = futures_util::stream::iter(
                rels.iter().map(|rel| self.get_head_of_async(rel, most)),
            )
            .buffered(super::HEADS_IN_FLIGHT)
            .enumerate();
            while let Some((i, small)) = got.next().await {
                if !each(i, small) {
                    return;
                }
            }
        })
    }

    async fn get_small_async(&self, rel: &str, most: u64) -> Result<Option<Small>> {
        let got = self.get_head_of_async(rel, most).await?;
        if let Some(small) = &got
            && small.bytes.len() as u64 > most
        {
            return Err(Error::Oversize {
                root: self.label.clone(),
                key: rel.to_owned(),
                most,
            });
        }
        Ok(got)
    }

    /// The object `rel`, its bytes read no further than `most + 1`.
    async fn get_head_of_async(&self, rel: &str, most: u64) -> Result<Option<Small>> {
        use futures_util::StreamExt as _;
        let key = self.key(rel);
        type Got = (Vec<u8>, Option<String>, chrono::DateTime<chrono::Utc>);
        let (got, answer) = failure::answered(async {
            let r = match self.store.get_opts(&key, GetOptions::default()).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            let (etag, modified) = (r.meta.e_tag.clone(), r.meta.last_modified);
            let mut bytes = Vec::new();
            let mut stream = r.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                bytes.extend_from_slice(&chunk);
                if bytes.len() as u64 > most {
                    bytes.truncate(usize::try_from(most.saturating_add(1)).unwrap_or(usize::MAX));
                    break;
                }
            }
            Ok::<Option<Got>, object_store::Error>(Some((bytes, etag, modified)))
        })
        .await;
        let Some((bytes, etag, modified)) =
            got.map_err(|e| self.store_failed("GET", rel, &e, answer))?
        else {
            return Ok(None);
        };
        Ok(Some(Small {
            bytes,
            etag: self.etag_of(rel, etag)?,
            last_modified: to_time(modified),
        }))
    }

    /// Streams each of `items` (a key, the most bytes to read of it, and
    /// the version it must still be, if any: `Error::Changed` when it is
    /// another or gone) into the writer `open` gives for its key, hashing
    /// it in the same pass, with up to [`GETS_IN_FLIGHT`] objects at once
    /// (a bundle of small files waits for its slowest round trips, not for
    /// their sum). A writer is opened when its object's GET starts and
    /// dropped when it ends, so memory stays at one chunk and one writer
    /// per object in flight. Each object stops after its `most` bytes
    /// (what follows is not read, and one byte more is counted: "bigger
    /// than it should be"); `None` for an object without a version that
    /// does not exist. The first error ends it: the GETs in flight are
    /// dropped, none more is started.
    pub fn get_many_into<W, E>(
        &self,
        items: &[(String, u64, Option<String>)],
        open: impl Fn(&str) -> std::result::Result<W, E>,
    ) -> std::result::Result<Vec<Option<Hashed>>, E>
    where
        W: Write,
        E: From<Error> + From<std::io::Error>,
    {
        use futures_util::{StreamExt as _, TryStreamExt as _};
        let open = &open;
        let gets = items.iter().map(|(rel, most, version)| async move {
            let mut out = open(rel)?;
            let got = self
                .stream_into::<E>(rel, &mut out, *most, version.clone())
                .await?;
            out.flush()?;
            Ok::<_, E>(got)
        });
        self.block_on(
            futures_util::stream::iter(gets)
                .buffered(GETS_IN_FLIGHT)
                .try_collect::<Vec<_>>(),
        )
    }

    async fn stream_into<E>(
        &self,
        rel: &str,
        out: &mut impl Write,
        most: u64,
        if_match: Option<String>,
    ) -> std::result::Result<Option<Hashed>, E>
    where
        E: From<Error> + From<std::io::Error>,
    {
        use futures_util::StreamExt as _;
        use sha2::Digest as _;
        let key = self.key(rel);
        let versioned = if_match.is_some();
        let options = GetOptions {
            if_match,
            ..GetOptions::default()
        };
        let (got, answer) = failure::answered(self.store.get_opts(&key, options)).await;
        let r = match got {
            Ok(r) => r,
            // Gone since it was listed with its version: changed too.
            Err(object_store::Error::NotFound { .. }) if !versioned => return Ok(None),
            Err(
                object_store::Error::NotFound { .. } | object_store::Error::Precondition { .. },
            ) => {
                return Err(Error::Changed {
                    root: self.label.clone(),
                    key: rel.to_owned(),
                }
                .into());
            }
            Err(e) => return Err(self.store_failed("GET", rel, &e, answer).into()),
        };
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        let mut stream = r.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.store_failed("GET", rel, &e, None))?;
            let room = most.saturating_sub(size);
            let take = &chunk[..chunk.len().min(usize::try_from(room).unwrap_or(usize::MAX))];
            hasher.update(take);
            size += take.len() as u64;
            out.write_all(take)?;
            if take.len() < chunk.len() {
                size += 1;
                break;
            }
        }
        Ok(Some(Hashed {
            sha256: crate::fs::hashing::format_digest(hasher),
            size,
        }))
    }

    /// Copies `from` to `to` inside the bucket (server-side; `to` is
    /// overwritten if it exists).
    pub fn copy_within(&self, from: &str, to: &str) -> Result<()> {
        self.check_conformance()?;
        let (src, dst) = (self.key(from), self.key(to));
        match self.block_on(self.store.copy(&src, &dst)) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.store_err("COPY", from, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::just_before;

    #[test]
    fn a_listing_starts_just_before_the_keys_it_wants() {
        let cases = [
            ("done/daily", "done/dailx\u{10FFFF}"),
            ("done/a b", "done/a a\u{10FFFF}"),
            ("done/x ", "done/x"),
            ("done/0", "done/ "),
            ("done/é", "done/è\u{10FFFF}"),
            ("", ""),
        ];
        for (start, want) in cases {
            let got = just_before(start);
            assert_eq!(got, want, "{start:?}");
            assert!(got.as_str() < start || start.is_empty(), "{start:?}");
        }
    }
}
