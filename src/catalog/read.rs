//! Reading a state file: classifying any bytes as absent, a valid catalog,
//! legacy (schema 1–3), future (> 4) or invalid, without ever guessing; a
//! catalog laid out as this tool writes it is read by `layout`, anything
//! else by serde_json over the fields of `form`, whole or, when huge, as a
//! stream.
//!
//! The only part of the catalog that reads a file: [`State::read`] and
//! [`State::read_file`] read a file the caller opened (never opening,
//! writing or renaming one); everything else takes bytes.

use super::form::Document;
use super::layout;
use super::model::{Catalog, OutputRecord, Shared, State};
use super::texts::{Buffer, RecordTexts};
use super::{SCHEMA_VERSION, form::RecordText};
use serde::Deserialize;
use std::borrow::Cow;
use std::sync::Arc;

/// The `len` bytes of `file`, read in two halves at once; `None` when the
/// file no longer has `len` bytes.
pub(super) fn read_in_halves(file: &std::fs::File, len: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    let size = usize::try_from(len).map_err(std::io::Error::other)?;
    // Zeroed by the system as it is first written (a fresh mapping).
    let mut bytes = vec![0u8; size];
    let (first, second) = bytes.split_at_mut(size / 2);
    let at = first.len() as u64;
    let (other, read) = crate::runtime::workers::beside(
        || file.read_exact_at(second, at),
        || file.read_exact_at(first, 0),
    );
    match read.and(other) {
        Ok(()) if file.read_at(&mut [0], len)? == 0 => Ok(Some(bytes)),
        Ok(()) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// A v4 catalog (its fields in any order), parsed in one pass and
/// checked; an error when the text is not that (the caller then
/// classifies it whole with [`State::classify`], which gives the same
/// answer for a v4 catalog and the right one for anything else).
fn read_v4<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
) -> serde_json::Result<State> {
    let doc = Document::<Outputs>::deserialize(&mut *de)?;
    de.end()?;
    if doc.schema_version != SCHEMA_VERSION {
        return Err(serde::de::Error::custom("not a schema 4 catalog"));
    }
    Ok(match finish_v4(doc) {
        Ok(c) => State::Catalog(c),
        Err(reason) => State::Invalid { reason },
    })
}

/// Catalogs up to this size (about 1.7 million records) are read into
/// memory whole and parsed there; bigger ones are parsed from the file as
/// a stream. Parsing from memory is about twice as fast, and the text,
/// dropped once parsed, costs once the file's size while the records are
/// built (the catalog's memory bound is three times the file).
const READ_WHOLE_UP_TO: u64 = 1 << 30;

impl State {
    /// Reads and classifies a state file. A catalog as this tool writes it
    /// is read in one pass (from a stream, its text never held whole, when
    /// it is over [`READ_WHOLE_UP_TO`]); anything else (legacy, future or
    /// invalid state, or a catalog edited into another key order) is
    /// classified by [`State::parse`], with the same result.
    pub fn read<F: std::io::Read + std::io::Seek>(file: &mut F) -> std::io::Result<State> {
        State::read_whole_up_to(file, READ_WHOLE_UP_TO, false).map(|(state, _)| state)
    }

    /// [`State::read`] of an open file, with the text of each record when
    /// `texts` and the file is laid out exactly as this tool writes it
    /// (almost always), so that writing the next catalog copies the records
    /// that did not change ([`Catalog::write_json_reusing`]); the texts
    /// keep the file's bytes. A large file is read in two
    /// halves at once, on two threads (copying it out of the page cache is
    /// a good part of reading it); one that changed size meanwhile is read
    /// again from the start, as one.
    pub fn read_file(
        file: &std::fs::File,
        texts: bool,
    ) -> std::io::Result<(State, Option<RecordTexts>)> {
        let len = file.metadata()?.len();
        if (layout::PARTS_FROM as u64..=READ_WHOLE_UP_TO).contains(&len)
            && let Some(bytes) = read_in_halves(file, len)?
        {
            return Ok(State::parse_whole(bytes, texts));
        }
        State::read_whole_up_to(&mut &*file, READ_WHOLE_UP_TO, texts)
    }

    /// The state in `bytes`, a whole file, with its texts when `texts`.
    fn parse_whole(bytes: Vec<u8>, texts: bool) -> (State, Option<RecordTexts>) {
        match texts {
            true => State::parse_with_texts(Arc::new(bytes)),
            false => (State::parse(&bytes), None),
        }
    }

    /// [`State::read_file`] of any reader (with the texts only when `texts`:
    /// their fingerprints cost a pass over every record), reading files up to
    /// `whole_up_to` bytes whole.
    pub(super) fn read_whole_up_to<F: std::io::Read + std::io::Seek>(
        file: &mut F,
        whole_up_to: u64,
        texts: bool,
    ) -> std::io::Result<(State, Option<RecordTexts>)> {
        // A catalog is read whole: parsing from memory is several times
        // faster than from a reader, and ids and digests are then borrowed
        // from the text instead of copied. Only a huge one is streamed.
        let len = std::io::Seek::seek(file, std::io::SeekFrom::End(0))?;
        std::io::Seek::seek(file, std::io::SeekFrom::Start(0))?;
        if len <= whole_up_to {
            let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
            std::io::Read::read_to_end(file, &mut bytes)?;
            return Ok(State::parse_whole(bytes, texts));
        }
        let reader = std::io::BufReader::with_capacity(64 * 1024, &mut *file);
        match read_v4(&mut serde_json::Deserializer::from_reader(reader)) {
            Ok(state) => return Ok((state, None)),
            Err(e) if e.is_io() => return Err(e.into()),
            Err(_) => {}
        }
        std::io::Seek::seek(file, std::io::SeekFrom::Start(0))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(file, &mut bytes)?;
        Ok((State::classify(&bytes), None))
    }

    /// [`State::parse`], with the text of each record when the bytes are
    /// laid out exactly as this tool writes them ([`State::read_file`]);
    /// the texts keep `bytes`.
    pub fn parse_with_texts(bytes: Buffer) -> (State, Option<RecordTexts>) {
        let text = (*bytes).as_ref();
        if let Some((catalog, spans)) = layout::read(text, true) {
            let texts = RecordTexts::read(bytes.clone(), &spans);
            return (State::Catalog(catalog), Some(texts));
        }
        (State::parse_general(text), None)
    }

    /// Classifies the bytes of a state file (a catalog as this tool writes
    /// it, fast: see `layout`).
    pub fn parse(bytes: &[u8]) -> State {
        match layout::read(bytes, false) {
            Some((catalog, _)) => State::Catalog(catalog),
            None => State::parse_general(bytes),
        }
    }

    /// [`State::parse`] of any layout: one pass for a catalog led by its
    /// version, else [`State::classify`].
    fn parse_general(bytes: &[u8]) -> State {
        read_v4(&mut serde_json::Deserializer::from_slice(bytes))
            .unwrap_or_else(|_| State::classify(bytes))
    }

    /// [`State::parse`] by serde alone, whatever the layout.
    pub(super) fn classify(bytes: &[u8]) -> State {
        /// Only `schema_version` is looked at; every other field is skipped
        /// without being built, so classifying a big catalog costs little.
        #[derive(Deserialize)]
        struct Head {
            schema_version: Option<serde_json::Value>,
        }
        let head: Head = match serde_json::from_slice(bytes) {
            Ok(head) => head,
            Err(e) if e.classify() == serde_json::error::Category::Data => {
                return State::Invalid {
                    reason: "state is not a JSON object".to_owned(),
                };
            }
            Err(e) => {
                return State::Invalid {
                    reason: format!("state is not valid JSON ({e})"),
                };
            }
        };
        let version = match head.schema_version {
            Some(serde_json::Value::Number(n)) if n.as_u64().is_some() => n.as_u64().unwrap_or(0),
            Some(other) => {
                return State::Invalid {
                    reason: format!("schema_version {other} is not a positive integer"),
                };
            }
            None => {
                return State::Invalid {
                    reason: "state has no schema_version".to_owned(),
                };
            }
        };
        match version {
            1..=3 => State::Legacy {
                schema_version: version,
            },
            SCHEMA_VERSION => match parse_v4(bytes) {
                Ok(c) => State::Catalog(c),
                Err(reason) => State::Invalid { reason },
            },
            v if v > SCHEMA_VERSION => State::Future { schema_version: v },
            v => State::Invalid {
                reason: format!("schema_version {v} is not a known version"),
            },
        }
    }
}

/// The `outputs` array, each record checked and made compact as it is
/// read (the text form of every record is never held at once). The first
/// record that fails its checks is kept as `problem`; the rest of the
/// array is then only parsed, so that a malformed document still reports
/// its syntax error first.
#[derive(Default)]
pub(super) struct Outputs {
    pub(super) records: Vec<OutputRecord>,
    pub(super) problem: Option<String>,
}

impl<'de> Deserialize<'de> for Outputs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Outputs, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Outputs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of output records")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Outputs, A::Error> {
                let mut out = Outputs::default();
                let mut shared = Shared::default();
                while out.problem.is_none() {
                    let Some(text) = seq.next_element::<RecordText>()? else {
                        return Ok(out);
                    };
                    match shared.record(text) {
                        Ok(r) => out.records.push(r),
                        Err(problem) => out.problem = Some(problem),
                    }
                }
                while seq.next_element::<RecordText>()?.is_some() {}
                Ok(out)
            }
        }
        d.deserialize_seq(Visit)
    }
}

fn parse_v4(bytes: &[u8]) -> Result<Catalog, String> {
    let raw: Document<Outputs> =
        serde_json::from_slice(bytes).map_err(|e| format!("invalid schema 4 state: {e}"))?;
    finish_v4(raw)
}

/// The checks of a schema-4 catalog once its JSON has been read.
pub(super) fn finish_v4(raw: Document<Outputs>) -> Result<Catalog, String> {
    if raw.state.mode != "catalog" {
        return Err(format!(
            "state.mode is {:?}; schema 4 requires \"catalog\"",
            raw.state.mode
        ));
    }
    if let Some(problem) = raw.outputs.problem {
        return Err(problem);
    }
    let mut catalog = Catalog {
        distributor_version: raw.distributor_version.map(Cow::into_owned),
        created_at: raw.created_at,
        updated_at: raw.updated_at,
        outputs: raw.outputs.records,
    };
    catalog.sort();
    if let Some(pair) = catalog.outputs.windows(2).find(|p| p[0].path == p[1].path) {
        return Err(format!("output {} is recorded twice", pair[0].path));
    }
    Ok(catalog)
}
