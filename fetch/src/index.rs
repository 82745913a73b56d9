//! A shard index: what a feed must know of a dataset before its shards arrive. The format is
//! WebDataset's own (`wids`, written by its `widsindex create`), so an index made for wids
//! serves here unchanged, and `ladle dataset index` writes one for shards on local disk:
//!
//! ```json
//! {"__kind__": "wids-shard-index-v1", "name": "photos",
//!  "shardlist": [{"url": "shard-000.tar", "nsamples": 1000, "filesize": 52428800}, ...],
//!  "classes": ["amber", "beryl"]}
//! ```
//!
//! `url` is relative to the index's own URL (its folder), or absolute; `base_path`, when
//! present, replaces that folder, as in wids. `classes` is ladle's addition (wids ignores
//! it): the class names, else they are unknown until the shards are read. Pure: no I/O.

use serde::{Deserialize, Serialize};

/// The most bytes of index read.
pub const MAX_INDEX_BYTES: u64 = 256 << 20;

/// One shard of an index, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexShard {
    /// Where it is: relative to the index, or absolute.
    pub url: String,
    /// Its samples (images).
    pub nsamples: u64,
    /// Its size in bytes.
    pub filesize: u64,
}

/// A shard index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardIndex {
    /// wids' marker, `wids-shard-index-v1`.
    #[serde(rename = "__kind__", default = "kind")]
    pub kind: String,
    /// The dataset's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where relative shard URLs start, instead of the index's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_path: Option<String>,
    /// The shards, in the order their samples are numbered.
    pub shardlist: Vec<IndexShard>,
    /// Class names (ladle's addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<Vec<String>>,
}

fn kind() -> String {
    KIND.to_owned()
}

/// The index kind written and read.
pub const KIND: &str = "wids-shard-index-v1";

/// Why an index cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url}: not a usable shard index: {why}")]
pub struct IndexError {
    /// The index's URL.
    pub url: String,
    /// What is wrong.
    pub why: String,
}

impl ShardIndex {
    /// Parses the index fetched from `url`.
    ///
    /// # Errors
    /// [`IndexError`] naming the URL and what is wrong: not JSON, another kind, no shards, a
    /// shard without samples.
    pub fn parse(url: &str, text: &str) -> Result<Self, IndexError> {
        let bad = |why: String| IndexError {
            url: url.to_owned(),
            why,
        };
        let index: Self = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if index.kind != KIND {
            return Err(bad(format!(
                "its __kind__ is {:?}, not {KIND:?}",
                index.kind
            )));
        }
        if index.shardlist.is_empty() {
            return Err(bad("its shardlist is empty".into()));
        }
        if let Some(shard) = index.shardlist.iter().find(|s| s.nsamples == 0) {
            return Err(bad(format!("shard {} has no samples", shard.url)));
        }
        if index.shardlist.len() > crate::spec::MAX_SHARDS {
            return Err(bad(format!(
                "{} shards, more than {}",
                index.shardlist.len(),
                crate::spec::MAX_SHARDS
            )));
        }
        let total: Option<u64> =
            (index.shardlist.iter()).try_fold(0u64, |a, s| a.checked_add(s.nsamples));
        if total.is_none_or(|t| t > 1 << 40) {
            return Err(bad("more samples than a dataset may have".into()));
        }
        Ok(index)
    }

    /// Each shard's absolute URL: its `url` against `base_path` or the folder of the index's
    /// own URL (`index_url`, `http(s)://` or `s3://`).
    pub fn resolve(&self, index_url: &str) -> Vec<String> {
        let folder = match &self.base_path {
            Some(base) if base.contains("://") => format!("{}/", base.trim_end_matches('/')),
            Some(base) => format!("{}/", join(index_url, base).trim_end_matches('/')),
            None => index_url
                .rfind('/')
                .map_or_else(String::new, |i| index_url[..=i].to_owned()),
        };
        self.shardlist
            .iter()
            .map(|s| join(&folder, &s.url))
            .collect()
    }
}

/// `url` against `base` (a folder ending in `/`): absolute as it is; `/path` from the host's
/// root; else appended.
fn join(base: &str, url: &str) -> String {
    if url.contains("://") {
        return url.to_owned();
    }
    if let Some(path) = url.strip_prefix('/') {
        let host_end = base
            .find("://")
            .and_then(|s| base[s + 3..].find('/').map(|i| s + 3 + i))
            .unwrap_or(base.len());
        return format!("{}/{path}", &base[..host_end]);
    }
    let url = url.strip_prefix("./").unwrap_or(url);
    format!("{base}{url}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    const INDEX: &str = r#"{"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "x",
        "shardlist": [{"url": "shard-0.tar", "nsamples": 3, "filesize": 10240},
                      {"url": "./sub/shard-1.tar", "nsamples": 2, "filesize": 20480, "dataset": "x"},
                      {"url": "/other/shard-2.tar", "nsamples": 1, "filesize": 512},
                      {"url": "https://cdn.example/shard-3.tar", "nsamples": 1, "filesize": 512}]}"#;

    #[test]
    fn a_wids_index_parses_with_its_extra_fields_and_resolves_against_its_folder() {
        let index = ShardIndex::parse("u", INDEX).unwrap();
        assert_eq!(index.shardlist.len(), 4);
        assert_eq!(index.classes, None);
        assert_eq!(
            index.resolve("http://h:8080/data/train/index.json"),
            [
                "http://h:8080/data/train/shard-0.tar",
                "http://h:8080/data/train/sub/shard-1.tar",
                "http://h:8080/other/shard-2.tar",
                "https://cdn.example/shard-3.tar"
            ]
        );
        assert_eq!(
            index.resolve("s3://bucket/train/index.json")[..2],
            [
                "s3://bucket/train/shard-0.tar",
                "s3://bucket/train/sub/shard-1.tar"
            ]
        );
        let based = ShardIndex {
            base_path: Some("http://elsewhere/d".into()),
            ..index
        };
        assert_eq!(
            based.resolve("http://h/i.json")[0],
            "http://elsewhere/d/shard-0.tar"
        );
    }

    #[test]
    fn what_is_not_a_usable_index_is_an_error_naming_its_url_and_why() {
        for (text, why) in [
            ("not json", "expected"),
            (r#"{"__kind__": "mds", "shardlist": []}"#, "__kind__"),
            (
                r#"{"__kind__": "wids-shard-index-v1", "shardlist": []}"#,
                "empty",
            ),
            (
                r#"{"shardlist": [{"url": "a.tar", "nsamples": 0, "filesize": 1}]}"#,
                "no samples",
            ),
            (r#"{"shardlist": [{"url": "a.tar"}]}"#, "nsamples"),
        ] {
            let e = ShardIndex::parse("http://h/i.json", text).unwrap_err();
            let message = e.to_string();
            assert!(message.starts_with("http://h/i.json: "), "{message}");
            assert!(message.contains(why), "{message} should say {why}");
        }
    }

    #[test]
    fn an_index_written_by_ladle_reads_back_the_same() {
        let index = ShardIndex {
            kind: KIND.into(),
            name: Some("p".into()),
            base_path: None,
            shardlist: vec![IndexShard {
                url: "a.tar".into(),
                nsamples: 4,
                filesize: 4096,
            }],
            classes: Some(vec!["amber".into(), "beryl".into()]),
        };
        let text = serde_json::to_string(&index).unwrap();
        assert_eq!(ShardIndex::parse("i", &text).unwrap(), index);
    }
}
