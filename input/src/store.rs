//! Where a data set's files are: a local path (a volume; a PVC on Kubernetes) or a prefix in object
//! storage, `s3://<bucket>/<prefix>` (AWS S3 or an S3-compatible store such as MinIO or Ceph),
//! listed and read through the same few functions, so that every file-based source (image
//! folders, tar shards, a text) reads from either.
//!
//! A location is carried as a [`Path`] in both cases: a local file is its own path, an object is
//! its URL `s3://<bucket>/<key>`, so that names, extensions, `join` and messages work unchanged in
//! the sources; [`list`], [`is_dir`], [`open`], [`reader`], [`readers`] and [`read`] tell them
//! apart by the scheme ([`is_remote`]).
//!
//! Expected flow: a job's data opens with [`configure`] (its `data.s3`: endpoint, region,
//! addressing); the first use of a bucket builds its client from those settings and the AWS
//! environment, and later uses share it. Requests run on a small runtime of this module's own, so
//! the sources stay synchronous and may call in from any thread.
//!
//! Credentials, as the AWS SDKs take them from the environment: AWS_ACCESS_KEY_ID with
//! AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN); IRSA's AWS_ROLE_ARN with
//! AWS_WEB_IDENTITY_TOKEN_FILE (what EKS injects for a service account with a role); EKS Pod
//! Identity or ECS container credentials; and, on AWS itself (no endpoint), the node's instance
//! role. An S3-compatible store (an endpoint) has no instance role, so there a missing credential
//! is refused up front with what to set. AWS_SKIP_SIGNATURE=true reads a public bucket unsigned.
//! The endpoint may also come from AWS_ENDPOINT_URL (as for the AWS CLI) when `data.s3` names
//! none, which is how `tandem data` commands reach a store.
//!
//! Guarantees:
//! - A shard is streamed: [`open`] gives a reader of ranged GETs of [`CHUNK`] bytes that fetches
//!   the next chunk while the current one is read, so an open object holds at most two chunks in
//!   memory whatever its size, and a forward seek past them costs no transfer.
//! - Image files are fetched whole, [`CONCURRENCY`] at a time ahead of their reader ([`readers`]).
//! - Every error names the URL and says what to do: a bucket that does not exist, access denied
//!   (naming the credentials that were tried), no object under a prefix, a store that cannot be
//!   reached, no credentials for an S3-compatible store.
//! - A request that fails transiently (a 5xx, a dropped connection) is retried with back-off for at
//!   most [`RETRY_TIMEOUT`].
//!
//! Caveats: counting tar shards in object storage reads them whole once (the count pass skips
//! image data by seeking, but a chunk holds many small members); listing an image folder in a
//! bucket costs one request per class.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Cursor, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, sync_channel};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use tandem_api::{S3Addressing, S3Spec};

use super::DataError;

/// The scheme of an object's URL.
pub const SCHEME: &str = "s3://";
/// Bytes of one ranged read of a streamed object.
pub const CHUNK: u64 = 4 << 20;
/// Whole objects fetched at once ahead of their reader, and files uploaded at once.
pub const CONCURRENCY: usize = 16;
/// How long a failing request is retried before its error is reported.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(30);
/// Objects up to this size are uploaded in one request, larger ones in parts of this size.
const PART: usize = 8 << 20;

/// A file or object as the sources read it: buffered and seekable.
pub trait Input: BufRead + Seek + Send {}
impl<T: BufRead + Seek + Send> Input for T {}

/// One entry of a folder or prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The file, object or sub-folder (for an object, its URL).
    pub path: PathBuf,
    /// Its last component.
    pub name: String,
    /// Whether it is a folder (in a bucket: a common prefix).
    pub dir: bool,
}

/// Whether `path` names an object (`s3://…`) rather than a local file.
pub fn is_remote(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.starts_with(SCHEME))
}

/// Sets how the buckets of `s3://` locations are reached (a job's `data.s3`); clients built with
/// other settings are dropped.
pub fn configure(settings: Option<&S3Spec>) {
    let settings = settings.cloned().unwrap_or_default();
    let mut registry = registry();
    if registry.settings != settings {
        registry.settings = settings;
        let own = std::mem::take(&mut registry.own);
        registry.buckets.retain(|name, _| own.contains_key(name));
        registry.own = own;
    }
}

/// Sets how the bucket of the URL `location` is reached (a job's `training.checkpoint.s3`),
/// whatever [`configure`] says for the others; its client, if built with other settings, is
/// dropped.
pub fn configure_bucket(location: &Path, settings: Option<&S3Spec>) {
    let url = location.to_string_lossy();
    let name = split_url(&url).0.to_owned();
    let settings = settings.cloned().unwrap_or_default();
    let mut registry = registry();
    if registry.own.get(&name) != Some(&settings) {
        registry.buckets.remove(&name);
        registry.own.insert(name, settings);
    }
}

/// The entries of the folder (or prefix) `dir`, sorted by name. An empty prefix is an error: in a
/// bucket it is what a wrong path looks like.
pub fn list(dir: &Path) -> Result<Vec<Entry>, DataError> {
    let mut entries = if is_remote(dir) {
        let (bucket, key) = locate(dir)?;
        let listed = bucket.list(&key)?;
        if listed.is_empty() {
            return Err(bucket.nothing_under(&key));
        }
        listed
    } else {
        let io = |source| DataError::Io { path: dir.to_owned(), source };
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let path = entry.path();
            let dir = path.is_dir();
            entries.push(Entry { name: entry.file_name().to_string_lossy().into_owned(), path, dir });
        }
        entries
    };
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// The files of the folder (or prefix) `dir` whose names end in `suffix`, sorted by name.
pub fn files(dir: &Path, suffix: &str) -> Result<Vec<PathBuf>, DataError> {
    Ok(list(dir)?.into_iter().filter(|e| !e.dir && e.name.ends_with(suffix)).map(|e| e.path).collect())
}

/// Whether `path` is a folder: a local directory, or a prefix with objects under it (a bucket's
/// root always is, when the bucket exists). A prefix written with a trailing slash that has no
/// object under it is an error.
pub fn is_dir(path: &Path) -> Result<bool, DataError> {
    if !is_remote(path) {
        return Ok(path.is_dir());
    }
    let (bucket, key) = locate(path)?;
    let any = bucket.any_under(&key)?;
    if !any && path.to_string_lossy().ends_with('/') {
        // A trailing slash says a folder was meant: that it is empty is the error to report.
        return Err(bucket.nothing_under(&key));
    }
    Ok(any)
}

/// Whether the file or object `path` exists. A missing bucket, denied access or a store that does
/// not answer is an error naming the URL, not `false`.
pub fn exists(path: &Path) -> Result<bool, DataError> {
    if !is_remote(path) {
        return Ok(path.exists());
    }
    let (bucket, key) = locate(path)?;
    bucket.exists(&key)
}

/// Opens the file or object `path` for streaming; returns it with its length in bytes.
pub fn open(path: &Path) -> Result<(Box<dyn Input>, u64), DataError> {
    if !is_remote(path) {
        let file = std::fs::File::open(path).map_err(|e| local_error(path, e))?;
        let len = file.metadata().map_err(|source| DataError::Io { path: path.to_owned(), source })?.len();
        return Ok((Box::new(BufReader::new(file)), len));
    }
    let (bucket, key) = locate(path)?;
    let len = bucket.size(&key)?;
    Ok((Box::new(ObjectReader::new(bucket, key, len)), len))
}

/// The file or object `path`, whole in memory (an image).
pub fn read(path: &Path) -> Result<Vec<u8>, DataError> {
    if !is_remote(path) {
        return std::fs::read(path).map_err(|e| local_error(path, e));
    }
    let (bucket, key) = locate(path)?;
    Ok(bucket.get(&key)?.to_vec())
}

/// A reader of the file or object `path` (an object is fetched whole: an image).
pub fn reader(path: &Path) -> Result<Box<dyn Input>, DataError> {
    if !is_remote(path) {
        let file = std::fs::File::open(path).map_err(|e| local_error(path, e))?;
        return Ok(Box::new(BufReader::new(file)));
    }
    let (bucket, key) = locate(path)?;
    Ok(Box::new(Cursor::new(bucket.get(&key)?)))
}

/// Readers of `paths`, in order: local files are opened as they are reached, objects fetched
/// [`CONCURRENCY`] at a time ahead of the one being read. `paths` may be endless (a training
/// epoch's order, wrapping): no more than [`CONCURRENCY`] are taken ahead of the reader.
pub fn readers<I>(paths: I) -> impl Iterator<Item = Result<Box<dyn Input>, DataError>>
where
    I: IntoIterator<Item = PathBuf>,
{
    Readers { paths: paths.into_iter(), ahead: VecDeque::new() }
}

/// Copies the file or folder `from` (recursively) to the object prefix `to`, keeping relative
/// names (`from/a/b.png` → `to/a/b.png`); returns the objects written and their bytes.
pub fn upload(from: &Path, to: &Path) -> Result<(u64, u64), DataError> {
    let (bucket, prefix) = locate(to)?;
    let mut files = Vec::new();
    if from.is_dir() {
        walk_files(from, &mut files)?;
        files.sort();
    } else {
        files.push(from.to_owned());
    }
    let base = if from.is_dir() { from } else { from.parent().unwrap_or(Path::new("")) };
    let mut pending = VecDeque::new();
    let (mut objects, mut bytes) = (0u64, 0u64);
    for file in files {
        let relative = file.strip_prefix(base).unwrap_or(&file).to_string_lossy().replace('\\', "/");
        let key = Key::from(format!("{}/{relative}", prefix.as_ref()).trim_start_matches('/'));
        let data = std::fs::read(&file).map_err(|source| DataError::Io { path: file.clone(), source })?;
        bytes += data.len() as u64;
        objects += 1;
        pending.push_back(spawn(bucket.clone().put(key, data))?);
        if pending.len() >= CONCURRENCY
            && let Some(done) = pending.pop_front()
        {
            wait(done)??;
        }
    }
    for done in pending {
        wait(done)??;
    }
    Ok((objects, bytes))
}

/// Names of the objects directly under the prefix `dir` (not of the sub-prefixes), sorted; none
/// when nothing lies there (a missing bucket, denied access or an unreachable store is an error).
pub fn list_objects(dir: &Path) -> Result<Vec<String>, DataError> {
    let (bucket, key) = locate(dir)?;
    let mut names: Vec<String> = bucket.list(&key)?.into_iter().filter(|e| !e.dir).map(|e| e.name).collect();
    names.sort();
    Ok(names)
}

/// Deletes the object `path` (an object that is already gone is no error).
pub fn delete(path: &Path) -> Result<(), DataError> {
    let (bucket, key) = locate(path)?;
    let this = Arc::clone(&bucket);
    let k = key.clone();
    match block(async move { this.store.delete(&k).await })? {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(bucket.failure(&key, &e)),
    }
}

fn walk_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DataError> {
    for entry in std::fs::read_dir(dir).map_err(|source| DataError::Io { path: dir.to_owned(), source })? {
        let path = entry.map_err(|source| DataError::Io { path: dir.to_owned(), source })?.path();
        if path.is_dir() {
            walk_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// Whether `e` (an I/O error from a reader of [`open`]) is a failed request to the store rather
/// than damage in the data: a source reports it instead of skipping the rest of a shard.
pub fn is_store_error(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<StoreFailure>())
}

fn local_error(path: &Path, e: std::io::Error) -> DataError {
    if e.kind() == std::io::ErrorKind::NotFound {
        DataError::Missing { path: path.to_owned() }
    } else {
        DataError::Io { path: path.to_owned(), source: e }
    }
}

// ----- the buckets -----

/// The settings and the clients built with them.
#[derive(Default)]
struct Registry {
    settings: S3Spec,
    /// Buckets reached with settings of their own ([`configure_bucket`]).
    own: HashMap<String, S3Spec>,
    buckets: HashMap<String, Arc<Bucket>>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
    // A panic while the lock was held left nothing half-done that matters: the map is a cache.
    REGISTRY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The bucket name and the key of an `s3://<bucket>/<key>` URL (the key may be empty).
fn split_url(url: &str) -> (&str, &str) {
    let rest = url.strip_prefix(SCHEME).unwrap_or(url);
    rest.split_once('/').unwrap_or((rest, ""))
}

/// The bucket of the URL `path` with its client, and the key (without a trailing slash).
fn locate(path: &Path) -> Result<(Arc<Bucket>, Key), DataError> {
    let url = path.to_string_lossy();
    let (name, key) = split_url(&url);
    let valid = (3..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if !valid {
        return Err(DataError::Config(format!(
            "{url}: {name:?} is not a bucket name (3 to 63 lower-case letters, digits, dots and hyphens); \
             write the location as s3://<bucket>/<prefix>"
        )));
    }
    let mut registry = registry();
    let bucket = match registry.buckets.get(name) {
        Some(b) => Arc::clone(b),
        None => {
            let (settings, purpose) = match registry.own.get(name) {
                Some(own) => (own, Purpose::Checkpoints),
                None => (&registry.settings, Purpose::Data),
            };
            let b = Arc::new(Bucket::connect(name, settings, purpose)?);
            registry.buckets.insert(name.to_owned(), Arc::clone(&b));
            b
        }
    };
    Ok((bucket, Key::from(key.trim_end_matches('/'))))
}

/// One bucket's client, and what messages say about it.
#[derive(Debug)]
struct Bucket {
    name: String,
    store: Arc<dyn ObjectStore>,
    /// `the S3-compatible store at <endpoint>` or `AWS S3 (<region>)`.
    place: String,
    /// The credentials the client signs with, for an access-denied message.
    credentials: &'static str,
    /// What the bucket holds, for messages.
    purpose: Purpose,
}

/// What a bucket is used for, which names the fields and permissions that messages point at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// A data set (`data.path`, `data.s3`).
    Data,
    /// Checkpoints (`training.checkpoint.url`, `training.checkpoint.s3`).
    Checkpoints,
}

impl Purpose {
    fn location(self) -> &'static str {
        match self {
            Purpose::Data => "data.path",
            Purpose::Checkpoints => "training.checkpoint.url",
        }
    }

    fn endpoint(self) -> &'static str {
        match self {
            Purpose::Data => "data.s3.endpoint",
            Purpose::Checkpoints => "training.checkpoint.s3.endpoint",
        }
    }

    fn permissions(self) -> &'static str {
        match self {
            Purpose::Data => "s3:ListBucket and s3:GetObject",
            Purpose::Checkpoints => "s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject",
        }
    }
}

/// A non-empty environment variable.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Bucket {
    fn connect(name: &str, settings: &S3Spec, purpose: Purpose) -> Result<Self, DataError> {
        let endpoint = settings
            .endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| env("AWS_ENDPOINT"))
            .map(|e| e.trim_end_matches('/').to_owned());
        let region =
            settings.region.clone().or_else(|| env("AWS_REGION")).or_else(|| env("AWS_DEFAULT_REGION"));
        let place = match &endpoint {
            Some(e) => format!("the S3-compatible store at {e}"),
            None => format!("AWS S3 ({})", region.as_deref().unwrap_or("us-east-1")),
        };
        let skip_signature = env("AWS_SKIP_SIGNATURE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let credentials = if env("AWS_ACCESS_KEY_ID").is_some() {
            "the access key in AWS_ACCESS_KEY_ID"
        } else if env("AWS_ROLE_ARN").is_some() && env("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() {
            "the web identity of AWS_ROLE_ARN (IRSA)"
        } else if env("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
            || env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        {
            "the container credentials (EKS Pod Identity or ECS)"
        } else if skip_signature {
            "no credentials (AWS_SKIP_SIGNATURE)"
        } else if endpoint.is_none() {
            "the instance role of this node"
        } else {
            return Err(DataError::Config(format!(
                "s3://{name}: no credentials for {place}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (on \
                 Kubernetes from a Secret, through env in the worker pod template), or AWS_ROLE_ARN with \
                 AWS_WEB_IDENTITY_TOKEN_FILE"
            )));
        };
        let virtual_hosted = match settings.addressing {
            Some(S3Addressing::VirtualHosted) => true,
            Some(S3Addressing::Path) => false,
            None => endpoint.is_none(),
        };
        let retry = RetryConfig { max_retries: 5, retry_timeout: RETRY_TIMEOUT, ..RetryConfig::default() };
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(name)
            .with_retry(retry)
            .with_virtual_hosted_style_request(virtual_hosted);
        if let Some(region) = &region {
            builder = builder.with_region(region);
        }
        if let Some(e) = &endpoint {
            // With virtual-hosted addressing the client expects the bucket in the endpoint's host.
            let e = match (virtual_hosted, e.split_once("://")) {
                (true, Some((scheme, host))) => format!("{scheme}://{name}.{host}"),
                _ => e.clone(),
            };
            builder = builder
                .with_endpoint(&e)
                .with_config(AmazonS3ConfigKey::S3Endpoint, &e)
                .with_allow_http(e.starts_with("http://"));
        }
        let store = builder.build().map_err(|e| DataError::Config(format!("s3://{name} on {place}: {e}")))?;
        Ok(Self { name: name.to_owned(), store: Arc::new(store), place, credentials, purpose })
    }

    fn url(&self, key: &Key) -> String {
        if key.as_ref().is_empty() {
            format!("{SCHEME}{}/", self.name)
        } else {
            format!("{SCHEME}{}/{}", self.name, key.as_ref())
        }
    }

    /// The error of a request about `key`, in words that say what to do.
    fn failure(&self, key: &Key, e: &object_store::Error) -> DataError {
        let url = self.url(key);
        let text = error_text(e);
        let code = s3_code(&text);
        let said = match &code {
            Some((code, message)) => format!("the store said {code}: {message}"),
            None => text.clone(),
        };
        let code = code.map(|(c, _)| c).unwrap_or_default();
        let denied = matches!(
            e,
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
        ) || [
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "InvalidToken",
            "ExpiredToken",
        ]
        .contains(&code.as_str())
            || text.contains("403 Forbidden");
        let what = if code == "NoSuchBucket" {
            format!(
                "bucket {} does not exist on {}: create it, or correct the bucket in {} (and {})",
                self.name,
                self.place,
                self.purpose.location(),
                self.purpose.endpoint()
            )
        } else if denied {
            format!(
                "access denied by {} with {}: check that the credentials are right and allow {} on bucket {}",
                self.place,
                self.credentials,
                self.purpose.permissions(),
                self.name
            )
        } else if matches!(e, object_store::Error::NotFound { .. }) || code == "NoSuchKey" {
            format!("no object {url} on {}: check {}", self.place, self.purpose.location())
        } else if text.contains("error sending request")
            || text.contains("onnect")
            || text.contains("dns error")
            || text.contains("timed out")
        {
            format!(
                "cannot reach {} (retried for up to {} s): check {} (or AWS_ENDPOINT_URL), the network and that \
                 the store is up",
                self.place,
                RETRY_TIMEOUT.as_secs(),
                self.purpose.endpoint()
            )
        } else {
            format!("the request to {} failed", self.place)
        };
        DataError::Config(format!("{url}: {what} ({said})"))
    }

    /// The error for a prefix with no object under it.
    fn nothing_under(&self, key: &Key) -> DataError {
        let url = self.url(key);
        DataError::Config(format!(
            "{url}: no object under this prefix on {}: upload the data there (`tandem data upload <folder> {url}`), \
             or correct data.path",
            self.place
        ))
    }

    /// The error for an object that was not found: the bucket's absence, when that is why.
    fn not_found(self: &Arc<Self>, key: &Key, e: &object_store::Error) -> DataError {
        // A HEAD's 404 has no body to tell a missing bucket from a missing key; a listing's has.
        let probe = Key::from(key.as_ref().rsplit_once('/').map_or("", |(dir, _)| dir));
        match self.any_under(&probe) {
            Err(missing) => missing,
            Ok(_) => self.failure(key, e),
        }
    }

    /// The direct children of the prefix `key`.
    fn list(self: &Arc<Self>, key: &Key) -> Result<Vec<Entry>, DataError> {
        let this = Arc::clone(self);
        let prefix = key.clone();
        let listed = block(async move { this.store.list_with_delimiter(Some(&prefix)).await })?
            .map_err(|e| self.failure(key, &e))?;
        let mut entries = Vec::new();
        for (p, dir) in listed
            .common_prefixes
            .iter()
            .map(|p| (p, true))
            .chain(listed.objects.iter().map(|o| (&o.location, false)))
        {
            let name = p.filename().unwrap_or_default().to_owned();
            entries.push(Entry { path: PathBuf::from(self.url(p)), name, dir });
        }
        Ok(entries)
    }

    /// Whether any object lies under the prefix `key` (the bucket's root: whether it exists).
    fn any_under(self: &Arc<Self>, key: &Key) -> Result<bool, DataError> {
        let this = Arc::clone(self);
        let prefix = key.clone();
        let first = block(async move {
            let prefix = (!prefix.as_ref().is_empty()).then_some(prefix);
            this.store.list(prefix.as_ref()).next().await
        })?;
        match first {
            None => Ok(key.as_ref().is_empty()),
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(self.failure(key, &e)),
        }
    }

    /// Whether the object `key` exists; a missing bucket is an error.
    fn exists(self: &Arc<Self>, key: &Key) -> Result<bool, DataError> {
        let this = Arc::clone(self);
        let k = key.clone();
        match block(async move { this.store.head(&k).await })? {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => {
                // A HEAD's 404 does not tell a missing bucket from a missing key; a listing does.
                let parent = Key::from(key.as_ref().rsplit_once('/').map_or("", |(dir, _)| dir));
                self.any_under(&parent).map(|_| false)
            }
            Err(e) => Err(self.failure(key, &e)),
        }
    }

    /// The size of the object `key`.
    fn size(self: &Arc<Self>, key: &Key) -> Result<u64, DataError> {
        let this = Arc::clone(self);
        let k = key.clone();
        match block(async move { this.store.head(&k).await })? {
            Ok(meta) => Ok(meta.size),
            Err(e @ object_store::Error::NotFound { .. }) => Err(self.not_found(key, &e)),
            Err(e) => Err(self.failure(key, &e)),
        }
    }

    /// The whole object `key`.
    fn get(self: &Arc<Self>, key: &Key) -> Result<Bytes, DataError> {
        wait(spawn(Arc::clone(self).fetch(key.clone()))?)?
    }

    /// Fetches the whole object `key`.
    async fn fetch(self: Arc<Self>, key: Key) -> Result<Bytes, DataError> {
        let got = match self.store.get(&key).await {
            Ok(got) => got.bytes().await,
            Err(e) => Err(e),
        };
        match got {
            Ok(bytes) => Ok(bytes),
            Err(e @ object_store::Error::NotFound { .. }) => {
                let this = Arc::clone(&self);
                // The probe blocks: run it off this runtime's threads.
                tokio::task::spawn_blocking(move || this.not_found(&key, &e))
                    .await
                    .map_or_else(|e| Err(DataError::Config(format!("object-store task failed: {e}"))), Err)
            }
            Err(e) => Err(self.failure(&key, &e)),
        }
    }

    /// Fetches bytes `range` of the object `key`.
    async fn fetch_range(self: Arc<Self>, key: Key, range: std::ops::Range<u64>) -> Result<Bytes, DataError> {
        self.store.get_range(&key, range).await.map_err(|e| self.failure(&key, &e))
    }

    /// Writes `data` as the object `key`: in one request, or in parts when it is large.
    async fn put(self: Arc<Self>, key: Key, data: Vec<u8>) -> Result<(), DataError> {
        let result = if data.len() <= PART {
            self.store.put(&key, PutPayload::from(data)).await.map(drop)
        } else {
            let mut writer =
                object_store::buffered::BufWriter::with_capacity(Arc::clone(&self.store), key.clone(), PART);
            let data = Bytes::from(data);
            let mut at = 0;
            let mut result = Ok(());
            while at < data.len() && result.is_ok() {
                let end = (at + PART).min(data.len());
                result = writer.put(data.slice(at..end)).await;
                at = end;
            }
            match result {
                Ok(()) => tokio::io::AsyncWriteExt::shutdown(&mut writer)
                    .await
                    .map_err(|e| object_store::Error::Generic { store: "S3", source: Box::new(e) }),
                Err(e) => {
                    let _ = writer.abort().await;
                    Err(e)
                }
            }
        };
        result.map_err(|e| self.failure(&key, &e))
    }
}

/// An error and its sources, as one line.
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// The `<Code>` and `<Message>` of an S3 error body within `text`.
fn s3_code(text: &str) -> Option<(String, String)> {
    let field = |tag: &str| {
        let open = format!("<{tag}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&format!("</{tag}>"))? + start;
        Some(text[start..end].trim().to_owned())
    };
    Some((field("Code")?, field("Message").unwrap_or_default()))
}

// ----- running requests -----

fn runtime() -> Result<&'static tokio::runtime::Runtime, DataError> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("tandem-store")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| DataError::Config(format!("starting the object-store client: {e}")))
}

/// Runs `fut` on the store's runtime; its output arrives on the receiver. Works from any thread,
/// a caller's own async runtime included.
fn spawn<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> Result<Receiver<T>, DataError> {
    let (tx, rx) = sync_channel(1);
    runtime()?.spawn(async move {
        let _ = tx.send(fut.await);
    });
    Ok(rx)
}

fn wait<T>(rx: Receiver<T>) -> Result<T, DataError> {
    rx.recv().map_err(|_| DataError::Config("an object-store request was dropped (its task panicked)".into()))
}

fn block<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> Result<T, DataError> {
    wait(spawn(fut)?)
}

/// A fetch under way: its bytes, or why it failed, arrive here.
type Fetch = Receiver<Result<Bytes, DataError>>;

/// [`readers`]: objects fetched ahead.
struct Readers<I> {
    paths: I,
    /// Fetches under way, in order; `None` for a local file (opened when reached).
    ahead: VecDeque<(PathBuf, Option<Fetch>)>,
}

impl<I: Iterator<Item = PathBuf>> Iterator for Readers<I> {
    type Item = Result<Box<dyn Input>, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.ahead.len() < CONCURRENCY
            && let Some(path) = self.paths.next()
        {
            let fetch = if is_remote(&path) {
                match locate(&path).and_then(|(bucket, key)| spawn(bucket.fetch(key))) {
                    Ok(rx) => Some(rx),
                    Err(e) => {
                        let (tx, rx) = sync_channel(1);
                        let _ = tx.send(Err(e));
                        Some(rx)
                    }
                }
            } else {
                None
            };
            self.ahead.push_back((path, fetch));
        }
        let (path, fetch) = self.ahead.pop_front()?;
        Some(match fetch {
            None => reader(&path),
            Some(rx) => wait(rx).and_then(|r| r).map(|b| Box::new(Cursor::new(b)) as Box<dyn Input>),
        })
    }
}

// ----- streaming one object -----

/// A failed request under a reader's I/O error (see [`is_store_error`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct StoreFailure(String);

/// Reads an object by ranged GETs of [`CHUNK`] bytes, the next one fetched while the current one
/// is read.
struct ObjectReader {
    bucket: Arc<Bucket>,
    key: Key,
    len: u64,
    pos: u64,
    chunk: Bytes,
    chunk_at: u64,
    ahead: Option<(u64, Fetch)>,
}

impl ObjectReader {
    fn new(bucket: Arc<Bucket>, key: Key, len: u64) -> Self {
        Self { bucket, key, len, pos: 0, chunk: Bytes::new(), chunk_at: 0, ahead: None }
    }

    fn request(&self, at: u64) -> Result<Fetch, DataError> {
        let range = at..(at + CHUNK).min(self.len);
        spawn(Arc::clone(&self.bucket).fetch_range(self.key.clone(), range))
    }

    /// Makes the chunk hold `pos` (which is below `len`).
    fn fill(&mut self) -> std::io::Result<()> {
        let failed = |e: DataError| std::io::Error::other(StoreFailure(e.to_string()));
        let at = self.pos;
        let chunk = match self.ahead.take() {
            Some((start, rx)) if start <= at && at < start + CHUNK => {
                let chunk = wait(rx).and_then(|r| r).map_err(failed)?;
                (start, chunk)
            }
            _ => (at, wait(self.request(at).map_err(failed)?).and_then(|r| r).map_err(failed)?),
        };
        (self.chunk_at, self.chunk) = chunk;
        if !(self.chunk_at <= at && at < self.chunk_at + self.chunk.len() as u64) {
            // The object is shorter than its listing said: it changed while being read.
            return Err(failed(DataError::Config(format!(
                "{}: the object changed while it was read (byte {at} is past its end)",
                self.bucket.url(&self.key)
            ))));
        }
        let next = self.chunk_at + self.chunk.len() as u64;
        if next < self.len {
            self.ahead = Some((next, self.request(next).map_err(failed)?));
        }
        Ok(())
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = {
            let available = self.fill_buf()?;
            let n = available.len().min(buf.len());
            buf[..n].copy_from_slice(&available[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for ObjectReader {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.pos >= self.len {
            return Ok(&[]);
        }
        let held = self.chunk_at <= self.pos && self.pos < self.chunk_at + self.chunk.len() as u64;
        if !held {
            self.fill()?;
        }
        let offset = (self.pos - self.chunk_at) as usize;
        Ok(&self.chunk[offset..])
    }

    fn consume(&mut self, amount: usize) {
        self.pos = (self.pos + amount as u64).min(self.len);
    }
}

impl Seek for ObjectReader {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        let Some(target) = target else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "seek before the object's start",
            ));
        };
        self.pos = target;
        Ok(target)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests: a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn an_s3_body_gives_its_code_and_message() {
        let text = "Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?><Error>\
                    <Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>";
        assert_eq!(
            s3_code(text),
            Some(("NoSuchBucket".to_owned(), "The specified bucket does not exist".to_owned()))
        );
        assert_eq!(s3_code("connection refused"), None);
    }

    #[test]
    fn a_url_is_remote_and_a_path_is_not() {
        assert!(is_remote(Path::new("s3://bucket/prefix")));
        assert!(!is_remote(Path::new("/data/s3://x")));
        let joined = Path::new("s3://bucket/images").join("train");
        assert_eq!(joined.to_str(), Some("s3://bucket/images/train"));
        assert_eq!(Path::new("s3://bucket/a/b.png").extension().and_then(|e| e.to_str()), Some("png"));
    }

    #[test]
    fn a_bad_bucket_name_is_refused_before_any_request() {
        let err = locate(Path::new("s3://Not_A_Bucket/x")).unwrap_err().to_string();
        assert!(err.contains("is not a bucket name"), "{err}");
    }
}
