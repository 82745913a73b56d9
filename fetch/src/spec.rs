//! Where a dataset's shards are, as a user writes it: `http://host/path/shard-{000..127}.tar`
//! or `s3://bucket/path/shard-{000..127}.tar` (WebDataset's brace notation: a zero-padded
//! numeric range, or a list `{a,b,c}`; several braces multiply), or `s3://bucket/prefix/`
//! (every `.tar` object under the prefix, listed when fetched). Pure: no I/O.

use std::fmt;

/// A remote dataset: its shards, in the order its samples are numbered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpec {
    /// What the user wrote (the dataset's name in logs and its key in the shard cache).
    pub spec: String,
    /// Where the shards are.
    pub shards: Shards,
}

/// A remote dataset's shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shards {
    /// On a web server: each shard's URL.
    Http(Vec<String>),
    /// In an S3 bucket: these keys.
    S3Keys {
        /// The bucket.
        bucket: String,
        /// The keys.
        keys: Vec<String>,
    },
    /// In an S3 bucket: every `.tar` object under `prefix`, in key order.
    S3Prefix {
        /// The bucket.
        bucket: String,
        /// The prefix.
        prefix: String,
    },
}

/// Why a dataset string is not a remote dataset ladle reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// A scheme this build does not fetch.
    #[error(
        "{spec}: {scheme}:// datasets are not read (http:// and s3:// are); copy the shards to a local folder"
    )]
    Scheme {
        /// The dataset string.
        spec: String,
        /// Its scheme.
        scheme: String,
    },
    /// The braces do not expand.
    #[error("{spec}: {why}")]
    Braces {
        /// The dataset string.
        spec: String,
        /// What is wrong.
        why: String,
    },
    /// More shards than a feed takes.
    #[error("{spec}: {count} shards, more than the {MAX_SHARDS} a dataset may have")]
    TooMany {
        /// The dataset string.
        spec: String,
        /// How many it expands to.
        count: usize,
    },
}

/// The most shards a remote dataset may have.
pub const MAX_SHARDS: usize = 1 << 20;

/// Whether `dataset` names a remote dataset (`scheme://`), not a local path.
pub fn is_remote(dataset: &str) -> bool {
    ladle_os::fs::is_url(dataset)
}

impl RemoteSpec {
    /// Parses `spec`.
    ///
    /// # Errors
    /// [`SpecError`] naming what is wrong.
    pub fn parse(spec: &str) -> Result<Self, SpecError> {
        let (scheme, rest) = spec.split_once("://").unwrap_or(("", spec));
        let braces = |s: &str| {
            expand(s).map_err(|why| SpecError::Braces {
                spec: spec.to_owned(),
                why,
            })
        };
        let shards = match scheme {
            "http" | "https" => Shards::Http(braces(spec)?),
            "s3" => {
                let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() || bucket.contains('{') {
                    return Err(SpecError::Braces {
                        spec: spec.to_owned(),
                        why: "no bucket named (s3://BUCKET/prefix/)".into(),
                    });
                }
                if path.contains('{') || path.ends_with(".tar") || path.ends_with(".json") {
                    Shards::S3Keys {
                        bucket: bucket.to_owned(),
                        keys: braces(path)?,
                    }
                } else {
                    Shards::S3Prefix {
                        bucket: bucket.to_owned(),
                        prefix: path.to_owned(),
                    }
                }
            }
            _ => {
                return Err(SpecError::Scheme {
                    spec: spec.to_owned(),
                    scheme: scheme.to_owned(),
                });
            }
        };
        Ok(Self {
            spec: spec.to_owned(),
            shards,
        })
    }
}

impl RemoteSpec {
    /// Whether this names a shard index (one `.json` object: WebDataset's `wids` index),
    /// which a feed streams instead of fetching every shard first.
    pub fn is_index(&self) -> bool {
        match &self.shards {
            Shards::Http(urls) => urls.len() == 1 && path_of(&urls[0]).ends_with(".json"),
            Shards::S3Keys { keys, .. } => keys.len() == 1 && keys[0].ends_with(".json"),
            Shards::S3Prefix { .. } => false,
        }
    }
}

/// A URL without its query (`?…`) and fragment.
fn path_of(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

impl fmt::Display for RemoteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec)
    }
}

/// Expands every `{…}` of `s`, left to right.
fn expand(s: &str) -> Result<Vec<String>, String> {
    let Some(open) = s.find('{') else {
        if s.contains('}') {
            return Err("a `}` without its `{`".into());
        }
        return Ok(vec![s.to_owned()]);
    };
    let close = s[open..]
        .find('}')
        .map(|c| open + c)
        .ok_or("a `{` without its `}`")?;
    let (head, body, tail) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    let choices = alternatives(body)?;
    let rests = expand(tail)?;
    let count = choices.len().saturating_mul(rests.len());
    if count > MAX_SHARDS {
        return Err(format!("{count} shards, more than {MAX_SHARDS}"));
    }
    let mut out = Vec::with_capacity(count);
    for choice in &choices {
        for rest in &rests {
            out.push(format!("{head}{choice}{rest}"));
        }
    }
    Ok(out)
}

/// The alternatives of one brace's body: `000..127` (zero-padded to the first bound's width)
/// or `a,b,c`.
fn alternatives(body: &str) -> Result<Vec<String>, String> {
    if let Some((from, to)) = body.split_once("..") {
        let bad = || format!("{{{body}}}: a range is {{FIRST..LAST}} of whole numbers");
        let (a, b): (u64, u64) = (
            from.parse().map_err(|_| bad())?,
            to.parse().map_err(|_| bad())?,
        );
        if b < a {
            return Err(format!("{{{body}}}: the range runs backwards"));
        }
        if b - a >= MAX_SHARDS as u64 {
            return Err(format!("{{{body}}}: more than {MAX_SHARDS} shards"));
        }
        let width = from.len();
        return Ok((a..=b).map(|n| format!("{n:0width$}")).collect());
    }
    if body.is_empty() || body.contains('{') {
        return Err(format!("{{{body}}}: an empty or nested brace"));
    }
    Ok(body.split(',').map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(spec: &str) -> Vec<String> {
        match RemoteSpec::parse(spec).unwrap().shards {
            Shards::Http(urls) => urls,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn braces_expand_as_webdataset_writes_them() {
        assert_eq!(
            http("http://h:8080/d/shard-{000..002}.tar"),
            [
                "http://h:8080/d/shard-000.tar",
                "http://h:8080/d/shard-001.tar",
                "http://h:8080/d/shard-002.tar"
            ]
        );
        assert_eq!(
            http("http://h/{train,val}-{8..10}.tar"),
            [
                "http://h/train-8.tar",
                "http://h/train-9.tar",
                "http://h/train-10.tar",
                "http://h/val-8.tar",
                "http://h/val-9.tar",
                "http://h/val-10.tar"
            ]
        );
        assert_eq!(http("http://h/one.tar"), ["http://h/one.tar"]);
    }

    #[test]
    fn an_s3_url_names_keys_by_braces_or_a_prefix_to_list() {
        let keys = RemoteSpec::parse("s3://b/d/s-{0..1}.tar").unwrap().shards;
        assert_eq!(
            keys,
            Shards::S3Keys {
                bucket: "b".into(),
                keys: vec!["d/s-0.tar".into(), "d/s-1.tar".into()]
            }
        );
        let prefix = RemoteSpec::parse("s3://b/d/").unwrap().shards;
        assert_eq!(
            prefix,
            Shards::S3Prefix {
                bucket: "b".into(),
                prefix: "d/".into()
            }
        );
        assert!(RemoteSpec::parse("s3:///d/").is_err());
    }

    #[test]
    fn a_bad_brace_or_scheme_is_an_error_naming_the_dataset() {
        for bad in [
            "http://h/{1..}.tar",
            "http://h/{3..1}.tar",
            "http://h/{a.tar",
            "http://h/a}.tar",
            "http://h/{}.tar",
            "http://h/{0..99999999}.tar",
        ] {
            let e = RemoteSpec::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with(bad), "{e}");
        }
        let e = RemoteSpec::parse("gs://bucket/prefix/").unwrap_err();
        assert!(matches!(e, SpecError::Scheme { .. }), "{e}");
        assert!(is_remote("s3://b/p") && is_remote("http://h/x") && !is_remote("/data/x"));
        assert!(!is_remote("") && !is_remote("./a:b//c"));
    }
}
