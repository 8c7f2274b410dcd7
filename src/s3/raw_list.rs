//! ListObjectsV2 asked and read here rather than by `object_store`, whose
//! listing fails a whole page on one key it cannot take as a path: a
//! control character, an empty, `.` or `..` segment, a trailing slash. A
//! producer can upload such a key into an intake's inbox (S3 takes any
//! UTF-8 key), and every other bundle must still be seen. The listing is
//! asked with `encoding-type=url`, so that any key travels as ASCII, and
//! signed with `object_store`'s own SigV4 signer over the root's client.
//!
//! Used only when `object_store` cannot read a listing
//! ([`S3Root::list_at_most`], [`S3Root::list_level`]), which is then read
//! again whole (the pages before the one that failed, again), with a
//! client of its own and no retry: an outage meanwhile fails the look,
//! which is tried again. No request more while no such key is listed.

use object_store::aws::{AmazonS3ConfigKey as K, AwsAuthorizer, AwsCredential};
use object_store::client::{HttpConnector as _, HttpRequestBody};
use serde::Deserialize;
use time::OffsetDateTime;

use super::{Error, Failure, Listed, Result, S3Root, failure};

/// One listing read whole: objects and common prefixes, full keys.
#[derive(Debug, Default)]
pub(super) struct Raw {
    pub objects: Vec<Listed>,
    pub prefixes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Page {
    #[serde(default)]
    contents: Vec<Contents>,
    #[serde(default)]
    common_prefixes: Vec<Prefix>,
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_continuation_token: Option<String>,
    /// `url` when the server encoded the keys as asked.
    #[serde(default)]
    encoding_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Contents {
    key: String,
    size: u64,
    last_modified: String,
    #[serde(rename = "ETag", default)]
    e_tag: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Prefix {
    prefix: String,
}

impl S3Root {
    /// The objects below the full key prefix `prefix` ("" or ending in
    /// `/`), with `/` as the delimiter when `delimited`; `None` when
    /// there are more than `most` objects (no further page is read).
    pub(super) async fn list_raw(
        &self,
        prefix: &str,
        delimited: bool,
        most: usize,
    ) -> Result<Option<Raw>> {
        let unusable = |what: &str| Error::Protocol {
            root: self.label.clone(),
            what: format!("LIST {prefix}: {what}"),
        };
        let Some((builder, options)) = &self.builder else {
            return Err(unusable("no s3 client to list with"));
        };
        let setting = |k: K| builder.get_config_value(&k);
        let (Some(bucket), Some(key_id), Some(secret_key)) = (
            setting(K::Bucket),
            setting(K::AccessKeyId),
            setting(K::SecretAccessKey),
        ) else {
            return Err(unusable("the s3 client has no bucket or credentials"));
        };
        let region = setting(K::Region).unwrap_or_else(|| "us-east-1".to_owned());
        let endpoint =
            setting(K::Endpoint).unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let credential = AwsCredential {
            key_id,
            secret_key,
            token: setting(K::Token),
        };
        let client = failure::GuardedConnector
            .connect(options)
            .map_err(|e| self.store_failed("LIST", prefix, &e, None))?;
        let failed = |failure: Failure| Error::Store {
            root: self.label.clone(),
            op: "LIST",
            key: prefix.to_owned(),
            failure,
        };
        let mut raw = Raw::default();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![("encoding-type", "url"), ("list-type", "2")];
            if delimited {
                query.push(("delimiter", "/"));
            }
            if !prefix.is_empty() {
                query.push(("prefix", prefix));
            }
            if let Some(t) = &token {
                query.push(("continuation-token", t));
            }
            query.sort();
            let query: Vec<String> = query
                .iter()
                .map(|(k, v)| format!("{k}={}", strict_encode(v)))
                .collect();
            let uri = format!(
                "{}/{}?{}",
                endpoint.trim_end_matches('/'),
                strict_encode(&bucket),
                query.join("&")
            );
            let mut request = http::Request::builder()
                .method(http::Method::GET)
                .uri(&uri)
                .body(HttpRequestBody::empty())
                .map_err(|_| unusable("the endpoint does not make a request address"))?;
            AwsAuthorizer::new(&credential, "s3", &region)
                .try_authorize(&mut request, None)
                .map_err(|e| self.store_failed("LIST", prefix, &e, None))?;
            let response = client
                .execute(request)
                .await
                .map_err(|e| failed(Failure::of_http(&e)))?;
            let status = response.status().as_u16();
            if status != 200 {
                return Err(failed(Failure::of_status(status)));
            }
            let body = response
                .into_body()
                .bytes()
                .await
                .map_err(|e| failed(Failure::of_http(&e)))?;
            let page = std::str::from_utf8(&body)
                .ok()
                .and_then(|text| quick_xml::de::from_str::<Page>(text).ok())
                .ok_or_else(|| failed(Failure::Unreadable))?;
            // A server that did not encode the keys sent them as they are.
            let encoded = page.encoding_type.as_deref() == Some("url");
            let decoded = |s: &str| {
                if encoded {
                    url_decoded(s).ok_or_else(|| failed(Failure::Unreadable))
                } else {
                    Ok(s.to_owned())
                }
            };
            for c in page.contents {
                if raw.objects.len() == most {
                    return Ok(None);
                }
                raw.objects.push(Listed {
                    path: decoded(&c.key)?,
                    size: c.size,
                    last_modified: OffsetDateTime::parse(
                        &c.last_modified,
                        &time::format_description::well_known::Rfc3339,
                    )
                    .map_err(|_| failed(Failure::Unreadable))?,
                    etag: c.e_tag,
                });
            }
            for p in page.common_prefixes {
                raw.prefixes.push(decoded(&p.prefix)?);
            }
            match page.next_continuation_token {
                Some(next) if page.is_truncated => token = Some(next),
                _ => return Ok(Some(raw)),
            }
        }
    }
}

/// `s` percent-encoded as SigV4 canonicalizes a query value: every byte
/// but `A-Z a-z 0-9 - _ . ~`.
fn strict_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A key as `encoding-type=url` sends it, decoded: `%XX` is a byte and
/// `+` a space (AWS and SeaweedFS send a space as `+`, and a `+` as
/// `%2B`). `None` when it is no UTF-8 or a `%` is not followed by two hex
/// digits.
fn url_decoded(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sent_url_encoded_are_decoded_whole() {
        let cases: &[(&str, Option<&str>)] = &[
            ("reports/inbox/a/b.txt", Some("reports/inbox/a/b.txt")),
            ("tab%09x/manifest.json", Some("tab\tx/manifest.json")),
            ("a+b%2Bc%25d", Some("a b+c%d")),
            ("x//y/./..", Some("x//y/./..")),
            ("%C3%A9t%C3%A9", Some("été")),
            ("bad%2", None),
            ("bad%zz", None),
            ("%FF", None),
        ];
        for (sent, want) in cases {
            assert_eq!(url_decoded(sent).as_deref(), *want, "{sent}");
        }
    }

    #[test]
    fn query_values_are_encoded_as_sigv4_canonicalizes_them() {
        assert_eq!(strict_encode("reports/inbox/"), "reports%2Finbox%2F");
        assert_eq!(strict_encode("a b+c~d_e-f.g"), "a%20b%2Bc~d_e-f.g");
        assert_eq!(strict_encode("é"), "%C3%A9");
    }

    #[test]
    fn a_page_is_read_with_its_prefixes_and_continuation() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>r/</Prefix><IsTruncated>true</IsTruncated><NextContinuationToken>abc=</NextContinuationToken><Contents><Key>r/tab%09x/manifest.json</Key><ETag>&#34;9dd4&#34;</ETag><Size>1</Size><StorageClass>STANDARD</StorageClass><LastModified>2026-12-07T19:17:05Z</LastModified></Contents><CommonPrefixes><Prefix>r/a+b/</Prefix></CommonPrefixes><EncodingType>url</EncodingType></ListBucketResult>"#;
        let page: Page = quick_xml::de::from_str(xml).unwrap();
        assert!(page.is_truncated);
        assert_eq!(page.next_continuation_token.as_deref(), Some("abc="));
        assert_eq!(page.contents.len(), 1);
        assert_eq!(page.contents[0].key, "r/tab%09x/manifest.json");
        assert_eq!(page.contents[0].e_tag.as_deref(), Some("\"9dd4\""));
        assert_eq!(page.contents[0].size, 1);
        assert_eq!(page.common_prefixes[0].prefix, "r/a+b/");
        assert_eq!(page.encoding_type.as_deref(), Some("url"));
    }
}
