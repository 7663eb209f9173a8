//! The cold store on an S3-compatible object store through `object_store`.
//!
//! Never relies on conditional writes (FLEET.md: some S3 stores ignore them): an immutable
//! key is read back before it is written, and a key holding other bytes is an error. Two
//! writers never race on one key because keys name the writer's epoch.

use crate::backend::ColdStore;
use crate::error::{BackendError, BackendResult};
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, PutOptions, PutPayload, RetryConfig};
use std::time::Duration;

/// Retries of one S3 request inside `object_store` before the call reports unavailable.
pub const S3_MAX_RETRIES: usize = 3;
/// Longest time `object_store` spends retrying one request.
pub const S3_RETRY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the object store is.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// `http://host:port` (path-style requests), or empty for AWS itself.
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
}

/// An S3 bucket as the cold store; cheap to clone.
#[derive(Clone, Debug)]
pub struct S3 {
    store: std::sync::Arc<AmazonS3>,
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable {
        reason: format!("s3 {what}: {error}"),
    }
}

impl S3 {
    pub fn new(config: &S3Config) -> BackendResult<S3> {
        // TLS goes through rustls with the ring provider (no C toolchain needed); installing
        // it twice is harmless, so the error of a second install is ignored.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key)
            .with_secret_access_key(&config.secret_key)
            .with_retry(RetryConfig {
                max_retries: S3_MAX_RETRIES,
                retry_timeout: S3_RETRY_TIMEOUT,
                ..RetryConfig::default()
            });
        if !config.endpoint.is_empty() {
            builder = builder
                .with_endpoint(&config.endpoint)
                .with_allow_http(config.endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        let store = builder.build().map_err(|error| BackendError::Other {
            reason: format!("s3 configuration: {error}"),
        })?;
        Ok(S3 {
            store: std::sync::Arc::new(store),
        })
    }

    async fn get_bytes(&self, key: &str) -> BackendResult<Option<Vec<u8>>> {
        let path = Path::from(key);
        match self.store.get_opts(&path, GetOptions::default()).await {
            Ok(result) => {
                let bytes = result
                    .bytes()
                    .await
                    .map_err(|error| unavailable("get body", error))?;
                Ok(Some(bytes.to_vec()))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(unavailable("get", error)),
        }
    }
}

impl ColdStore for S3 {
    async fn put_immutable(&self, key: &str, bytes: Vec<u8>) -> BackendResult<()> {
        match self.get_bytes(key).await? {
            Some(existing) if existing == bytes => return Ok(()),
            Some(_) => {
                return Err(BackendError::Other {
                    reason: format!("immutable key {key} holds other bytes"),
                })
            }
            None => {}
        }
        self.store
            .put_opts(
                &Path::from(key),
                PutPayload::from(bytes),
                PutOptions::default(),
            )
            .await
            .map_err(|error| unavailable("put", error))?;
        Ok(())
    }

    async fn get(&self, key: &str) -> BackendResult<Option<Vec<u8>>> {
        self.get_bytes(key).await
    }

    async fn head(&self, key: &str) -> BackendResult<Option<u64>> {
        let options = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        match self.store.get_opts(&Path::from(key), options).await {
            Ok(result) => Ok(Some(result.meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(unavailable("head", error)),
        }
    }

    async fn list(&self, prefix: &str) -> BackendResult<Vec<String>> {
        let prefix = Path::from(prefix);
        let mut listing = self.store.list(Some(&prefix));
        let mut keys = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|error| unavailable("list", error))?;
            keys.push(meta.location.to_string());
        }
        keys.sort();
        Ok(keys)
    }
}
