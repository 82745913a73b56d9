//! `s3://bucket/prefix/` and `s3://bucket/shard-{000..127}.tar`: S3 and S3-compatible stores,
//! configured the way the AWS SDKs are (nothing new to learn), each object fetched through a
//! presigned URL by the same HTTP fetcher as `http://` shards (`rusty-s3` signs, sans I/O).
//!
//! - **Credentials**: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`);
//!   else the profile `$AWS_PROFILE` (else `default`) of the shared credentials file
//!   (`$AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`); else none (a public
//!   bucket, unsigned).
//! - **Endpoint**: `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL` (an S3-compatible store;
//!   `http://` allowed, path-style addressing); else AWS's own for the region
//!   (virtual-host style).
//! - **Region**: `AWS_REGION`, else `AWS_DEFAULT_REGION`, else `us-east-1`.
//!
//! Nothing secret is printed: errors and logs name objects as `s3://bucket/key`, never the
//! signed URLs.

use std::path::PathBuf;
use std::time::Duration;

use rusty_s3::actions::ListObjectsV2;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

use crate::FetchError;

/// How long a presigned URL stays valid: fetches queue behind each other on a large
/// dataset.
const SIGNED_FOR: Duration = Duration::from_secs(12 * 3600);

/// Where and as whom S3 is reached, from the environment.
#[derive(Clone)]
pub struct S3Env {
    endpoint: String,
    style: UrlStyle,
    region: String,
    credentials: Option<Credentials>,
}

impl std::fmt::Debug for S3Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Env")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("credentials", &self.credentials.as_ref().map(|_| "(set)"))
            .finish()
    }
}

/// The `[profile]` section's keys of an AWS shared credentials file: (key id, secret,
/// session token). Pure.
pub fn parse_credentials_file(
    text: &str,
    profile: &str,
) -> Option<(String, String, Option<String>)> {
    let mut in_profile = false;
    let (mut key, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = name.trim() == profile;
            continue;
        }
        if !in_profile {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim().to_owned();
        match k.trim() {
            "aws_access_key_id" => key = Some(v),
            "aws_secret_access_key" => secret = Some(v),
            "aws_session_token" => token = Some(v),
            _ => {}
        }
    }
    Some((key?, secret?, token))
}

impl S3Env {
    /// From `env` (a process's environment) and `home` (its home directory).
    pub fn from(env: impl Fn(&str) -> Option<String>, home: Option<PathBuf>) -> Self {
        let set = |k: &str| env(k).filter(|v| !v.is_empty());
        let region = set("AWS_REGION")
            .or_else(|| set("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".to_owned());
        let (endpoint, style) = match set("AWS_ENDPOINT_URL_S3").or_else(|| set("AWS_ENDPOINT_URL"))
        {
            Some(endpoint) => (endpoint, UrlStyle::Path),
            None => (
                format!("https://s3.{region}.amazonaws.com"),
                UrlStyle::VirtualHost,
            ),
        };
        let credentials = match (set("AWS_ACCESS_KEY_ID"), set("AWS_SECRET_ACCESS_KEY")) {
            (Some(key), Some(secret)) => Some(match set("AWS_SESSION_TOKEN") {
                Some(token) => Credentials::new_with_token(key, secret, token),
                None => Credentials::new(key, secret),
            }),
            _ => {
                let file = set("AWS_SHARED_CREDENTIALS_FILE")
                    .map(PathBuf::from)
                    .or_else(|| home.map(|h| h.join(".aws").join("credentials")));
                let profile = set("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
                file.and_then(|f| std::fs::read_to_string(f).ok())
                    .and_then(|text| parse_credentials_file(&text, &profile))
                    .map(|(key, secret, token)| match token {
                        Some(token) => Credentials::new_with_token(key, secret, token),
                        None => Credentials::new(key, secret),
                    })
            }
        };
        Self {
            endpoint,
            style,
            region,
            credentials,
        }
    }

    /// From this process's environment.
    pub fn from_process() -> Self {
        Self::from(
            |k| std::env::var(k).ok(),
            std::env::var_os("HOME").map(PathBuf::from),
        )
    }

    fn bucket(&self, name: &str) -> Result<Bucket, FetchError> {
        let endpoint = self.endpoint.parse().map_err(|e| FetchError::Url {
            url: self.endpoint.clone(),
            why: format!("the S3 endpoint ({e})"),
        })?;
        Bucket::new(endpoint, self.style, name.to_owned(), self.region.clone()).map_err(|e| {
            FetchError::Url {
                url: format!("s3://{name}"),
                why: format!("{e} (endpoint {})", self.endpoint),
            }
        })
    }

    /// A presigned GET of `key` in `bucket`.
    pub(crate) fn get_url(&self, bucket: &str, key: &str) -> Result<String, FetchError> {
        let bucket = self.bucket(bucket)?;
        Ok(bucket
            .get_object(self.credentials.as_ref(), key)
            .sign(SIGNED_FOR)
            .to_string())
    }

    /// The keys under `prefix` in `bucket` that end in `.tar`, in order, from as many
    /// `ListObjectsV2` pages as there are.
    pub(crate) fn list_tars(
        &self,
        bucket_name: &str,
        prefix: &str,
        get: &dyn Fn(&str, &str) -> Result<String, FetchError>,
    ) -> Result<Vec<String>, FetchError> {
        let bucket = self.bucket(bucket_name)?;
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut list = ListObjectsV2::new(&bucket, self.credentials.as_ref());
            list.with_prefix(prefix.to_owned());
            if let Some(token) = &token {
                list.with_continuation_token(token.clone());
            }
            let name = format!("s3://{bucket_name}/{prefix} (listing)");
            let text = get(list.sign(SIGNED_FOR).as_ref(), &name)?;
            let page = ListObjectsV2::parse_response(&text).map_err(|e| FetchError::Url {
                url: name.clone(),
                why: format!("the listing is not S3's: {e}"),
            })?;
            keys.extend(
                page.contents
                    .into_iter()
                    .map(|c| c.key)
                    .filter(|k| k.ends_with(".tar")),
            );
            match page.next_continuation_token {
                Some(next) => token = Some(next),
                None => break,
            }
        }
        keys.sort();
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_named_profile_of_the_shared_file() {
        let file = "[default]\naws_access_key_id = A\naws_secret_access_key = B\n\n[work]\n# comment\naws_access_key_id=C\naws_secret_access_key=D\naws_session_token = T\n";
        assert_eq!(
            parse_credentials_file(file, "default"),
            Some(("A".into(), "B".into(), None))
        );
        assert_eq!(
            parse_credentials_file(file, "work"),
            Some(("C".into(), "D".into(), Some("T".into())))
        );
        assert_eq!(parse_credentials_file(file, "none"), None);
        assert_eq!(
            parse_credentials_file("[default]\naws_access_key_id = A\n", "default"),
            None
        );
    }

    #[test]
    fn an_endpoint_from_the_environment_is_path_style_and_aws_is_virtual_host() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let local = S3Env::from(
            env(&[
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
                ("AWS_ACCESS_KEY_ID", "k"),
                ("AWS_SECRET_ACCESS_KEY", "s"),
            ]),
            None,
        );
        let url = local.get_url("b", "d/shard-0.tar").unwrap();
        assert!(
            url.starts_with("http://127.0.0.1:9000/b/d/shard-0.tar?"),
            "{url}"
        );
        assert!(url.contains("X-Amz-Signature="), "{url}");
        assert!(format!("{local:?}").contains("(set)") && !format!("{local:?}").contains("\"s\""));
        let aws = S3Env::from(env(&[("AWS_DEFAULT_REGION", "eu-west-1")]), None);
        let url = aws.get_url("b", "k.tar").unwrap();
        assert!(
            url.starts_with("https://b.s3.eu-west-1.amazonaws.com/k.tar"),
            "{url}"
        );
        let specific = S3Env::from(
            env(&[
                ("AWS_ENDPOINT_URL", "http://a:1"),
                ("AWS_ENDPOINT_URL_S3", "http://b:2"),
            ]),
            None,
        );
        assert!(
            specific
                .get_url("x", "y.tar")
                .unwrap()
                .starts_with("http://b:2/x/y.tar")
        );
    }
}
