//! The controller: watches TrainingJobs and their pods and runs the reconcile pipeline
//! validate → build → apply → status for each job.
//!
//! Expected flow of one reconcile: skip jobs managed by another controller
//! (`runPolicy.managedBy`); [`crate::validate::validate`] (a bad spec gets a `Failed` status
//! naming the field, and no objects) into the [`ValidatedJob`] every later step reads; read the
//! job's pods from the pod cache; [`crate::plan::decide`];
//! server-side apply the Service, ConfigMap, hostfiles and PodGroup when the cached object is
//! missing or carries another [`HASH_ANNOTATION`], create the Secrets if absent; for a Running job
//! with a parameter server read its progress from PS replica 0 ([`crate::progress`]); when the plan
//! restarts no unit, create and delete pods first (a crash before the status write repeats the
//! same plan), else write the status first (see [`crate::plan`]); publish Events; delete the job
//! when its TTL expired.
//!
//! Caches: pods (stripped to what the plan reads, [`plan::keep_what_is_read`]), ConfigMaps and
//! Services (metadata only, managed fields stripped) labelled
//! `app.kubernetes.io/managed-by=tandem-operator` are watched once and kept in reflector stores
//! ([`Caches`]); TrainingJobs are cached without their managed fields and `kubectl apply`'s
//! last-applied copy; a reconcile makes no API request when nothing changed. The caches may lag
//! behind the writes of the previous reconcile: creates use deterministic names and treat
//! AlreadyExists as success, deletes treat NotFound as success, applies are idempotent, so a stale
//! cache costs a redundant request, never a duplicate. Secrets are never listed or watched: the
//! operator remembers (in memory, by job UID) which Secrets it found or created, and each job's
//! token; every [`Context::prune_every`] both are pruned to the UIDs in the TrainingJob cache, so
//! deleted jobs cost no memory for the operator's lifetime.
//!
//! Guarantees: every write uses the field manager [`names::FIELD_MANAGER`]; a reconcile is
//! idempotent, so running it twice, or after a crash half-way, converges to the same objects;
//! errors are mapped to fixed categories ([`Error::category`]) for metrics and retried with
//! exponential back-off per job ([`error_policy`], [`error_delay`]). Deleting a TrainingJob
//! deletes its children through owner references.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::{self as runtime_controller, Action};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use tandem_api::names;
use tandem_api::{Backend, JobPhase, Progress, Role, TrainingJob, TrainingJobStatus};

use crate::metrics::{Metrics, RoleLabel};
use crate::plan::{self, Observed, Plan, Settings, condition};
use crate::validate::{self, ValidatedJob};
use crate::{builder, kueue, progress, secrets};

/// A failed step of a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading from the API server failed.
    #[error("reading {what}: {source}")]
    Read {
        /// What was read.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Creating or applying a child failed.
    #[error("applying {what}: {source}")]
    Apply {
        /// The object.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting a child (or the expired job) failed.
    #[error("deleting {what}: {source}")]
    Delete {
        /// The object.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Writing the status failed.
    #[error("writing the status of TrainingJob {job}: {source}")]
    Status {
        /// The job.
        job: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The PodGroup could not be applied.
    #[error(
        "applying PodGroup {name} ({api_version}): {source}; runPolicy.scheduling.gang needs that scheduler's PodGroup CRD installed"
    )]
    PodGroup {
        /// The PodGroup.
        name: String,
        /// Its API version.
        api_version: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A Kueue object could not be read or written.
    #[error(
        "{what}: {source}; a job labelled kueue.x-k8s.io/queue-name needs Kueue's CRDs installed and the operator's Kueue RBAC (chart value kueue.enabled)"
    )]
    Kueue {
        /// What was done to which object.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Secret material could not be generated.
    #[error(transparent)]
    Random(#[from] secrets::RandomError),
    /// A child's name is taken by an object this job does not own: the job fails, and the object
    /// is left as it is.
    #[error(
        "{kind} {namespace}/{name} already exists and is not owned by this TrainingJob ({owners}); the operator does not take over objects it did not create: delete or rename that {kind}, or give the job another name"
    )]
    Conflict {
        /// The kind of the object.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Who owns it, in words.
        owners: String,
    },
    /// A child's name is still taken by the child of an earlier job of the same name, which the
    /// garbage collector has not removed yet; retried.
    #[error(
        "{kind} {namespace}/{name} still belongs to an earlier TrainingJob {job} (uid {uid}); waiting for the garbage collector to remove it"
    )]
    Predecessor {
        /// The kind of the object.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The earlier job's name (this job's).
        job: String,
        /// The earlier job's UID.
        uid: String,
    },
}

impl Error {
    /// The API server's error underneath, if that is what failed.
    pub fn kube_source(&self) -> Option<&kube::Error> {
        match self {
            Error::Read { source, .. }
            | Error::Apply { source, .. }
            | Error::Delete { source, .. }
            | Error::Status { source, .. }
            | Error::PodGroup { source, .. }
            | Error::Kueue { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The fixed category of the error, used as the metrics label.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Read { .. } => "read",
            Error::Apply { .. } => "apply",
            Error::Delete { .. } => "delete",
            Error::Status { .. } => "status",
            Error::PodGroup { .. } => "podgroup",
            Error::Kueue { .. } => "kueue",
            Error::Random(_) => "internal",
            Error::Conflict { .. } => "conflict",
            Error::Predecessor { .. } => "predecessor",
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// API client (in tests: impersonating the operator's ServiceAccount).
    pub client: Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Metrics,
    /// Decision settings.
    pub settings: Settings,
    /// Job tokens, for reading the PS status endpoints.
    pub tokens: progress::Tokens,
    /// How often the progress of a Running job with a parameter server is read.
    pub progress_every: Duration,
    /// Most reconciles in flight at once (0: unbounded).
    pub concurrency: u16,
    /// How long a job's reconcile waits for more of its events (trailing edge): the burst of
    /// events as a job's children are created and start is reconciled, and its status written,
    /// once instead of once per event. Zero reconciles at each event.
    pub debounce: Duration,
    /// How often what is remembered of deleted jobs (known Secrets, tokens) is dropped.
    pub prune_every: Duration,
    /// Give every job a NetworkPolicy that admits only its own pods, and these operator pods to
    /// the status port (`--network-policy`); `None`: no policy.
    pub network_policy: Option<builder::OperatorPeer>,
    /// Hold jobs labelled `kueue.x-k8s.io/queue-name` until Kueue admits their Workload
    /// (`--kueue`; see [`crate::kueue`]).
    pub kueue: bool,
    /// The reflector stores, set by [`JobController::new`]; without them every read goes to the API.
    caches: OnceLock<Caches>,
    /// `<job uid>/<secret name>` of the Secrets known to exist (found or created), and
    /// `<job uid>/NetworkPolicy/<hash>` of the NetworkPolicies applied.
    known_secrets: Mutex<HashSet<String>>,
    /// Failed reconciles in a row, for [`error_policy`]'s back-off.
    failures: Failures,
}

/// Default of [`Context::concurrency`].
pub const DEFAULT_CONCURRENCY: u16 = 16;

/// Default of [`Context::debounce`], in milliseconds.
pub const DEFAULT_DEBOUNCE_MS: u64 = 200;

/// Default of [`Context::debounce`].
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(DEFAULT_DEBOUNCE_MS);

/// Default of [`Context::prune_every`].
pub const DEFAULT_PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Annotation holding a hash of the desired Service or ConfigMap as last applied; an object whose
/// cached annotation matches the desired hash is not applied again.
pub const HASH_ANNOTATION: &str = "tandem.dev/applied-hash";

/// The reflector stores of the operator's children (labelled as managed by it).
#[derive(Clone)]
pub struct Caches {
    /// Pods.
    pub pods: Store<Pod>,
    /// ConfigMaps (metadata only).
    pub config_maps: Store<PartialObjectMeta<ConfigMap>>,
    /// Services (metadata only).
    pub services: Store<PartialObjectMeta<Service>>,
}

impl Caches {
    async fn ready(&self) {
        // Only fails if the writer was dropped, i.e. the controller stopped.
        let _ = self.pods.wait_until_ready().await;
        let _ = self.config_maps.wait_until_ready().await;
        let _ = self.services.wait_until_ready().await;
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Context {
    /// A context reporting Events as `tandem-operator` (instance `instance`).
    pub fn new(client: Client, metrics: Metrics, settings: Settings, instance: Option<String>) -> Self {
        let reporter = Reporter { controller: names::FIELD_MANAGER.to_owned(), instance };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            settings,
            tokens: progress::Tokens::default(),
            progress_every: progress::POLL_EVERY,
            concurrency: DEFAULT_CONCURRENCY,
            debounce: DEFAULT_DEBOUNCE,
            prune_every: DEFAULT_PRUNE_EVERY,
            network_policy: None,
            kueue: false,
            caches: OnceLock::new(),
            known_secrets: Mutex::new(HashSet::new()),
            failures: Failures::default(),
        }
    }

    fn caches(&self) -> Option<&Caches> {
        self.caches.get()
    }

    fn secret_known(&self, key: &str) -> bool {
        self.known_secrets.lock().is_ok_and(|s| s.contains(key))
    }

    fn remember_secret(&self, key: String) {
        if let Ok(mut s) = self.known_secrets.lock() {
            s.insert(key);
        }
    }

    /// Forgets what is remembered of every job whose UID is not in `live`.
    pub fn forget_jobs_except(&self, live: &HashSet<String>) {
        if let Ok(mut s) = self.known_secrets.lock() {
            s.retain(|key| key.split_once('/').is_some_and(|(uid, _)| live.contains(uid)));
        }
        self.failures.retain(live);
        self.tokens.retain(live);
    }

    /// UIDs of the jobs something is remembered of (known Secrets, tokens, failed reconciles).
    pub fn remembered_jobs(&self) -> HashSet<String> {
        let mut uids = self.tokens.uids();
        if let Ok(s) = self.known_secrets.lock() {
            uids.extend(s.iter().filter_map(|key| Some(key.split_once('/')?.0.to_owned())));
        }
        uids.extend(self.failures.uids());
        uids
    }
}

/// Failed reconciles in a row, by job UID.
#[derive(Debug, Default)]
pub struct Failures(Mutex<HashMap<String, u32>>);

impl Failures {
    /// Counts one more failed reconcile of the job with `uid`; returns its failures in a row.
    pub fn record(&self, uid: &str) -> u32 {
        let Ok(mut by_uid) = self.0.lock() else { return 1 };
        let count = by_uid.entry(uid.to_owned()).or_default();
        *count = count.saturating_add(1);
        *count
    }

    /// The job with `uid` reconciled: its back-off starts over.
    pub fn clear(&self, uid: &str) {
        if let Ok(mut by_uid) = self.0.lock() {
            by_uid.remove(uid);
        }
    }

    fn retain(&self, live: &HashSet<String>) {
        if let Ok(mut by_uid) = self.0.lock() {
            by_uid.retain(|uid, _| live.contains(uid));
        }
    }

    fn uids(&self) -> HashSet<String> {
        self.0.lock().map(|by_uid| by_uid.keys().cloned().collect()).unwrap_or_default()
    }
}

/// First wait of [`error_delay`].
pub const ERROR_BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Longest wait of [`error_delay`].
pub const ERROR_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// How long a job waits after its `failures`-th failed reconcile in a row: [`ERROR_BACKOFF_BASE`],
/// doubling each time, at most [`ERROR_BACKOFF_MAX`]. A job whose PodGroup CRD is missing is then
/// retried every five minutes, not every five seconds forever.
pub fn error_delay(failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(16);
    ERROR_BACKOFF_BASE.saturating_mul(1 << shift).min(ERROR_BACKOFF_MAX)
}

/// A hex SHA-256 of the JSON of `object` (before the hash annotation is added).
fn desired_hash<K: Serialize>(object: &K) -> String {
    let bytes = serde_json::to_vec(object).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    digest.as_ref().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

fn with_hash<K: Resource + Serialize>(mut object: K) -> (K, String) {
    let hash = desired_hash(&object);
    object
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(HASH_ANNOTATION.to_owned(), hash.clone());
    (object, hash)
}

/// Whether the cache (if any) holds the object: `None` without a cache.
fn cached<K>(store: Option<&Store<PartialObjectMeta<K>>>, ns: &str, name: &str) -> Option<bool>
where
    K: Resource<DynamicType = ()> + Clone,
    PartialObjectMeta<K>: Resource<DynamicType = ()> + Clone,
{
    store.map(|s| s.get(&ObjectRef::new(name).within(ns)).is_some())
}

/// Puts child `object` of `kind` in place, given whether the operator's cache holds an object of
/// its name (`cached`; `None`: no cache). One the cache lacks is most likely new: it is created
/// (one request, where reading first would take two; a create never takes over another's object,
/// and the caches, holding only the operator's own children, cannot say a name is free). One that
/// exists (the cache holds it, there is no cache, or the create answers 409) is read and checked
/// to be `job`'s before the forced server-side apply, which would take over any object of that name.
async fn put_child<K>(
    job: &ValidatedJob<'_>,
    api: &Api<K>,
    kind: &'static str,
    object: &K,
    cached: Option<bool>,
) -> Result<(), Error>
where
    K: Resource + Serialize + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let name = object.name_any();
    if cached == Some(false) {
        match api.create(&post_params(), object).await {
            Ok(_) => return Ok(()),
            Err(e) if is_status(&e, 409) => {}
            Err(source) => return Err(Error::Apply { what: format!("{kind} {name}"), source }),
        }
    }
    check_existing(job, api, kind, &name).await?;
    apply(api, object).await
}

/// Whether the cached object (if any) already carries `hash`.
fn up_to_date<K>(store: Option<&Store<PartialObjectMeta<K>>>, ns: &str, name: &str, hash: &str) -> bool
where
    K: Resource<DynamicType = ()> + Clone,
    PartialObjectMeta<K>: Resource<DynamicType = ()> + Clone,
{
    let Some(store) = store else { return false };
    store
        .get(&ObjectRef::new(name).within(ns))
        .is_some_and(|o| o.annotations().get(HASH_ANNOTATION).is_some_and(|h| h == hash))
}

fn apply_params() -> PatchParams {
    PatchParams::apply(names::FIELD_MANAGER).force()
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

async fn apply<K>(api: &Api<K>, object: &K) -> Result<(), Error>
where
    K: Resource + Serialize + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let name = object.name_any();
    api.patch(&name, &apply_params(), &Patch::Apply(object)).await.map(drop).map_err(|source| Error::Apply {
        what: format!("{} {name}", K::kind(&K::DynamicType::default())),
        source,
    })
}

/// Whether an existing child `name` of `kind` (its metadata `meta`) may be used by `job`: it must
/// carry an owner reference with the job's UID. The child of an earlier job of the same name (the
/// garbage collector has not caught up) is a [`Error::Predecessor`], retried; anything else is an
/// [`Error::Conflict`] that fails the job.
fn check_owner(
    job: &ValidatedJob<'_>,
    kind: &'static str,
    name: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<(), Error> {
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    if owners.iter().any(|o| o.uid == job.uid) {
        return Ok(());
    }
    let namespace = job.namespace.to_owned();
    if let Some(earlier) = owners.iter().find(|o| o.kind == TrainingJob::kind(&()) && o.name == job.name) {
        return Err(Error::Predecessor {
            kind,
            namespace,
            name: name.to_owned(),
            job: job.name.to_owned(),
            uid: earlier.uid.clone(),
        });
    }
    let owners = if owners.is_empty() {
        "it has no owner".to_owned()
    } else {
        let list: Vec<String> =
            owners.iter().map(|o| format!("{} {} (uid {})", o.kind, o.name, o.uid)).collect();
        format!("owned by {}", list.join(", "))
    };
    Err(Error::Conflict { kind, namespace, name: name.to_owned(), owners })
}

/// Reads the metadata of child `name` (if it exists) and checks that `job` owns it.
async fn check_existing<K>(
    job: &ValidatedJob<'_>,
    api: &Api<K>,
    kind: &'static str,
    name: &str,
) -> Result<(), Error>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let meta = api
        .get_metadata_opt(name)
        .await
        .map_err(|source| Error::Read { what: format!("{kind} {name}"), source })?;
    match meta {
        Some(meta) => check_owner(job, kind, name, &meta.metadata),
        None => Ok(()),
    }
}

fn post_params() -> PostParams {
    PostParams { field_manager: Some(names::FIELD_MANAGER.to_owned()), ..PostParams::default() }
}

/// Creates a Secret unless it exists: Secrets hold generated material that must not change.
/// A Secret found or created once is remembered for the job's UID, and not read again. The
/// create comes first (a new job's Secret takes one request); one that exists answers 409 and is
/// then read and checked.
async fn create_once(
    ctx: &Context,
    job: &ValidatedJob<'_>,
    api: &Api<Secret>,
    name: &str,
    make: impl FnOnce() -> Result<Secret, Error>,
) -> Result<(), Error> {
    let key = format!("{}/{name}", job.uid);
    if ctx.secret_known(&key) {
        return Ok(());
    }
    let read = |source| Error::Read { what: format!("Secret {name}"), source };
    let secret = make()?;
    match api.create(&post_params(), &secret).await {
        Ok(_) => {
            if name == names::token_secret(job.name)
                && let Some(token) = secrets::token_of(&secret)
            {
                ctx.tokens.remember(job.uid, &token);
            }
            ctx.remember_secret(key);
            Ok(())
        }
        Err(e) if is_status(&e, 409) => {
            // Created meanwhile, by an earlier reconcile or by someone else.
            if let Some(existing) = api.get_opt(name).await.map_err(read)? {
                check_owner(job, "Secret", name, &existing.metadata)?;
            }
            ctx.remember_secret(key);
            Ok(())
        }
        Err(source) => Err(Error::Apply { what: format!("Secret {name}"), source }),
    }
}

async fn ensure_children(job: &ValidatedJob<'_>, ctx: &Context) -> Result<(), Error> {
    let (ns, name) = (job.namespace, job.name);
    let client = ctx.client.clone();
    let caches = ctx.caches();
    let (service, hash) = with_hash(builder::service(job));
    let services = caches.map(|c| &c.services);
    if !up_to_date(services, ns, &service.name_any(), &hash) {
        let api = Api::<Service>::namespaced(client.clone(), ns);
        put_child(job, &api, "Service", &service, cached(services, ns, &service.name_any())).await?;
    }
    if let Some(operator) = &ctx.network_policy {
        let (policy, hash) = with_hash(builder::network_policy(job, operator));
        let key = format!("{}/NetworkPolicy/{hash}", job.uid);
        if !ctx.secret_known(&key) {
            let policies = Api::<NetworkPolicy>::namespaced(client.clone(), ns);
            check_existing(job, &policies, "NetworkPolicy", &policy.name_any()).await?;
            apply(&policies, &policy).await?;
            ctx.remember_secret(key);
        }
    }
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let mut wanted = vec![builder::config_map(job)];
    let secrets_api = Api::<Secret>::namespaced(client.clone(), ns);
    create_once(ctx, job, &secrets_api, &names::token_secret(name), || {
        Ok(builder::token_secret(job, &secrets::job_token()?))
    })
    .await?;
    if job.spec.workers.backend == Backend::Mpi {
        create_once(ctx, job, &secrets_api, &names::ssh_secret(name), || {
            Ok(builder::ssh_secret(job, &secrets::ssh_keys(&format!("tandem@{name}"))?))
        })
        .await?;
        wanted.extend((0..job.spec.workers.groups).map(|group| builder::hostfile(job, group)));
    }
    let cached_maps = caches.map(|c| &c.config_maps);
    for cm in wanted {
        let (cm, hash) = with_hash(cm);
        if !up_to_date(cached_maps, ns, &cm.name_any(), &hash) {
            put_child(job, &config_maps, "ConfigMap", &cm, cached(cached_maps, ns, &cm.name_any())).await?;
        }
    }
    // Hostfiles of groups that scaling removed.
    let existing: Vec<(String, BTreeMap<String, String>)> = match caches {
        Some(c) => c
            .config_maps
            .state()
            .iter()
            .filter(|cm| cm.namespace().as_deref() == Some(ns) && is_child_of(cm.labels(), name))
            .map(|cm| (cm.name_any(), cm.labels().clone()))
            .collect(),
        None => config_maps
            .list(&ListParams::default().labels(&names::job_selector(name)))
            .await
            .map_err(|source| Error::Read { what: format!("ConfigMaps of {name}"), source })?
            .items
            .into_iter()
            .map(|cm| (cm.name_any(), cm.labels().clone()))
            .collect(),
    };
    for (cm_name, labels) in existing {
        let group = labels.get(names::LABEL_GROUP).and_then(|g| g.parse::<u32>().ok());
        let stale =
            group.is_some_and(|g| g >= job.spec.workers.groups || job.spec.workers.backend != Backend::Mpi);
        if stale {
            delete(&config_maps, &cm_name, "ConfigMap", &DeleteParams::default()).await?;
        }
    }
    Ok(())
}

/// Whether `labels` match [`names::job_selector`] of job `name`.
fn is_child_of(labels: &BTreeMap<String, String>, name: &str) -> bool {
    labels.get(names::LABEL_JOB).is_some_and(|j| j == name)
        && labels.get(names::LABEL_MANAGED_BY).is_some_and(|m| m == names::FIELD_MANAGER)
}

/// The job's pods: from the pod cache, or listed when there is none.
async fn job_pods(job: &ValidatedJob<'_>, ctx: &Context) -> Result<Vec<Pod>, Error> {
    let (ns, name) = (job.namespace, job.name);
    if let Some(caches) = ctx.caches() {
        caches.ready().await;
        let mut pods: Vec<Pod> = caches
            .pods
            .state()
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(ns) && is_child_of(p.labels(), name))
            .map(|p| Pod::clone(p))
            .collect();
        pods.sort_by_key(ResourceExt::name_any);
        return Ok(pods);
    }
    Ok(Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default().labels(&names::job_selector(name)))
        .await
        .map_err(|source| Error::Read { what: format!("pods of {name}"), source })?
        .items)
}

async fn delete<K>(api: &Api<K>, name: &str, kind: &str, params: &DeleteParams) -> Result<(), Error>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(source) => Err(Error::Delete { what: format!("{kind} {name}"), source }),
    }
}

async fn sync_pod_group(job: &ValidatedJob<'_>, ctx: &Context, want: bool) -> Result<(), Error> {
    let scheduling = &job.spec.run_policy.scheduling;
    if !scheduling.gang {
        return Ok(());
    }
    let resource = builder::pod_group_resource(scheduling.pod_group_flavor);
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), job.namespace, &resource);
    let name = names::pod_group(job.name);
    if want {
        let object = builder::pod_group(job);
        api.patch(&name, &apply_params(), &Patch::Apply(&object)).await.map(drop).map_err(|source| {
            Error::PodGroup { name: name.clone(), api_version: resource.api_version.clone(), source }
        })
    } else {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(source) => Err(Error::Delete { what: format!("PodGroup {name}"), source }),
        }
    }
}

/// Nodes of terminating pods that are gone or not Ready.
async fn lost_nodes(ctx: &Context, pods: &[Pod]) -> BTreeSet<String> {
    let nodes: BTreeSet<&str> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .filter_map(|p| p.spec.as_ref()?.node_name.as_deref())
        .collect();
    let api = Api::<Node>::all(ctx.client.clone());
    let mut lost = BTreeSet::new();
    for node in nodes {
        match api.get_opt(node).await {
            Ok(None) => {
                lost.insert(node.to_owned());
            }
            Ok(Some(n)) => {
                let ready = n
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if !ready {
                    lost.insert(node.to_owned());
                }
            }
            Err(e) => tracing::warn!(%node, error = %e, "cannot read node of a terminating pod"),
        }
    }
    lost
}

/// Applies `status` to the status of TrainingJob `name` in `namespace`.
async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &TrainingJobStatus,
) -> Result<(), Error> {
    let api = Api::<TrainingJob>::namespaced(ctx.client.clone(), namespace);
    let body = serde_json::json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "status": status,
    });
    api.patch_status(name, &apply_params(), &Patch::Apply(&body))
        .await
        .map(drop)
        .map_err(|source| Error::Status { job: name.to_owned(), source })
}

/// Reads the progress of a job that was Running from its status endpoint
/// ([`progress::status_address`]); anything that fails is logged at debug and gives `None` (the
/// last progress stays in the status).
async fn read_progress(job: &ValidatedJob<'_>, ctx: &Context, pods: &[Pod]) -> Option<Progress> {
    let name = job.name;
    let phase = job.job.status.as_ref().and_then(|s| s.phase);
    // A scaling job trains on: its progress, and its new group count, matter then most.
    let running = matches!(phase, Some(JobPhase::Running | JobPhase::Scaling));
    if !running {
        ctx.tokens.forget(job.uid);
        return None;
    }
    let left = progress::last_reported(job, pods);
    let Some(addr) = progress::status_address(job, pods) else {
        tracing::debug!(job = %name, "no running status endpoint with an IP; progress from ended groups only");
        return left;
    };
    let token = match ctx.tokens.get(&ctx.client, job).await {
        Ok(Some(token)) => token,
        Ok(None) => {
            tracing::debug!(job = %name, "the job token Secret is missing or empty; progress unchanged");
            return left;
        }
        Err(e) => {
            tracing::debug!(job = %name, error = %e, "cannot read the job token; progress unchanged");
            return left;
        }
    };
    match progress::fetch(addr, &token).await {
        Ok(ps) => {
            announce_groups(job, addr, &token, ps.planned_groups).await;
            progress::furthest(ps.progress, left)
        }
        Err(e) => {
            if e.is_unauthorized() {
                ctx.tokens.forget(job.uid);
            }
            tracing::debug!(job = %name, error = %e, "cannot read progress; keeping the last one");
            left
        }
    }
}

/// Tells PS replica 0 at `addr` the job's group count when the count it plans epochs with
/// (`planned`, from its status) differs: the mounted job config reaches it only when the kubelet
/// refreshes the file, up to a minute later, and epochs planned meanwhile would count a group
/// that left (or miss one that came). A failure is logged at debug; the next poll tries again.
async fn announce_groups(
    job: &ValidatedJob<'_>,
    addr: std::net::SocketAddr,
    token: &str,
    planned: Option<u32>,
) {
    let groups = job.spec.workers.groups;
    if job.progress_from_groups() || planned.is_none_or(|p| p == groups) {
        return;
    }
    match progress::post_groups(addr, token, groups).await {
        Ok(()) => {
            tracing::info!(job = %job.name, groups, planned = ?planned, "told PS 0 the job's group count")
        }
        Err(e) => {
            tracing::debug!(job = %job.name, groups, error = %e, "cannot tell PS 0 the group count; retrying at the next poll")
        }
    }
}

/// Publishes an Event about the job that `reference` names.
async fn publish(reference: &ObjectReference, ctx: &Context, warning: bool, reason: &str, message: &str) {
    let event = Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: reason.to_owned(),
        note: Some(message.chars().take(1000).collect()),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    match ctx.recorder.publish(&event, reference).await {
        Ok(()) => {}
        // The job goes with its namespace; its last Events have no one left to read them.
        Err(e) if namespace_terminating(&e) => {
            tracing::debug!(job = ?reference.name, reason, "namespace being deleted; event dropped")
        }
        Err(e) => tracing::warn!(job = ?reference.name, error = %e, "cannot publish event"),
    }
}

/// Whether the API server refused a write because its namespace is being deleted.
fn namespace_terminating(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403
        && s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating")))
}

/// A spec the operator cannot build: fail the job once, with the reason.
async fn reject(
    job: &TrainingJob,
    ctx: &Context,
    error: &validate::ValidationError,
) -> Result<Action, Error> {
    fail_once(job, ctx, "InvalidSpec", error.to_string()).await
}

/// Fails the job (phase `Failed`, a `Failed` condition with `reason` and `message`, an Event),
/// unless it already failed with that message.
async fn fail_once(job: &TrainingJob, ctx: &Context, reason: &str, message: String) -> Result<Action, Error> {
    let mut status = job.status.clone().unwrap_or_default();
    let already = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::FAILED && c.status == "True" && c.message == message);
    if !already {
        let now = Timestamp::now();
        status.phase = Some(JobPhase::Failed);
        status.observed_generation = job.metadata.generation;
        status.completion_time.get_or_insert(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        plan::set_condition(
            &mut status.conditions,
            condition::FAILED,
            true,
            reason,
            &message,
            now,
            job.metadata.generation,
        );
        // A job without a namespace did not come from the API server; writing fails and says so.
        let namespace = job.namespace().unwrap_or_default();
        write_status(ctx, &namespace, &job.name_any(), &status).await?;
        publish(&job.object_ref(&()), ctx, true, reason, &message).await;
    }
    Ok(Action::await_change())
}

/// Carries out `plan`'s deletions and creations; new pods get `placement`, the admission of a
/// job Kueue admitted.
async fn execute(
    job: &ValidatedJob<'_>,
    ctx: &Context,
    plan: &Plan,
    placement: Option<&kueue::Placement>,
) -> Result<(), Error> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), job.namespace);
    for name in &plan.delete {
        delete(&pods, name, "Pod", &DeleteParams::default()).await?;
    }
    for name in &plan.force_delete {
        tracing::warn!(pod = %name, "force-deleting a pod stuck terminating on a lost node");
        delete(
            &pods,
            name,
            "Pod",
            &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() },
        )
        .await?;
    }
    for &(role, attempt) in &plan.create {
        create_pod(job, &pods, role, attempt, placement).await?;
    }
    Ok(())
}

async fn create_pod(
    job: &ValidatedJob<'_>,
    pods: &Api<Pod>,
    role: Role,
    attempt: u32,
    placement: Option<&kueue::Placement>,
) -> Result<(), Error> {
    let mut pod = builder::pod(job, role, attempt);
    if let Some(placement) = placement {
        kueue::place(&mut pod, role, placement);
    }
    let name = pod.name_any();
    let params = PostParams { field_manager: Some(names::FIELD_MANAGER.to_owned()), ..PostParams::default() };
    match pods.create(&params, &pod).await {
        Ok(_) => Ok(()),
        // Created by an earlier reconcile whose pod list was stale; the next list sees it.
        Err(e) if is_status(&e, 409) => Ok(()),
        Err(source) => Err(Error::Apply { what: format!("Pod {name}"), source }),
    }
}

/// The Workloads of `job`'s namespace.
fn workload_api(job: &ValidatedJob<'_>, ctx: &Context) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), job.namespace, &kueue::workload_resource())
}

/// Where `job` stands in Kueue, for a job labelled with a queue (`None` otherwise). Its Workload
/// is created when missing and replaced when the job no longer matches it (scaled); an evicted
/// Workload whose pods are all gone gets its reservation cleared, so that Kueue queues it again.
async fn kueue_admission(
    job: &ValidatedJob<'_>,
    ctx: &Context,
    pods: &[Pod],
) -> Result<Option<kueue::Admission>, Error> {
    let Some(queue) = kueue::queue_name(job) else { return Ok(None) };
    if job.job.status.as_ref().and_then(|s| s.phase).is_some_and(JobPhase::is_finished) {
        return Ok(None);
    }
    let api = workload_api(job, ctx);
    let name = kueue::workload_name(job.name);
    let failed = |what: &str| {
        let what = format!("{what} Workload {}/{name}", job.namespace);
        move |source| Error::Kueue { what, source }
    };
    let existing = api.get_opt(&name).await.map_err(failed("reading"))?;
    let workload = match existing {
        Some(w) if kueue::matches(&w, job) => w,
        Some(_) => {
            tracing::info!(job = %job.name, workload = %name, "the job was resized: replacing its Workload");
            match api.delete(&name, &DeleteParams::foreground()).await {
                Ok(_) => {}
                Err(e) if is_status(&e, 404) => {}
                Err(source) => return Err(failed("deleting")(source)),
            }
            let message = format!(
                "the job now has {} worker groups: its Workload {name} is replaced, and the new size waits for admission",
                job.spec.workers.groups
            );
            return Ok(Some(kueue::Admission::Waiting { reason: "Resized".to_owned(), message }));
        }
        None => {
            let priority = kueue_priority(job, ctx).await?;
            let object = kueue::workload(job, queue, priority.as_ref());
            let params =
                PostParams { field_manager: Some(names::FIELD_MANAGER.to_owned()), ..PostParams::default() };
            match api.create(&params, &object).await {
                Ok(_) => {}
                Err(e) if is_status(&e, 409) => {}
                Err(source) => return Err(failed("creating")(source)),
            }
            let message = format!("Workload {name} submitted to LocalQueue {queue}");
            return Ok(Some(kueue::Admission::Waiting { reason: "Submitted".to_owned(), message }));
        }
    };
    let flavor_api = Api::<DynamicObject>::all_with(ctx.client.clone(), &kueue::flavor_resource());
    let mut flavors = BTreeMap::new();
    for flavor in kueue::flavors_used(&workload) {
        let what = format!("reading ResourceFlavor {flavor}");
        match flavor_api.get_opt(&flavor).await {
            Ok(Some(object)) => {
                flavors.insert(flavor, kueue::Flavor::of(&object));
            }
            Ok(None) => {}
            Err(source) => return Err(Error::Kueue { what, source }),
        }
    }
    let admission = kueue::admission(&workload, &flavors);
    if matches!(admission, kueue::Admission::Evicted { .. }) && pods.is_empty() {
        let status = kueue::cleared_reservation(&workload, Timestamp::now());
        let params = PatchParams::apply(kueue::ADMISSION_MANAGER).force();
        api.patch_status(&name, &params, &Patch::Apply(&status))
            .await
            .map_err(failed("clearing the reservation of"))?;
        tracing::info!(job = %job.name, workload = %name, "evicted job's pods are gone: reservation cleared");
    }
    Ok(Some(admission))
}

/// The job's priority for its Workload: its WorkloadPriorityClass (label
/// `kueue.x-k8s.io/priority-class`), else the PriorityClass of its pods.
async fn kueue_priority(job: &ValidatedJob<'_>, ctx: &Context) -> Result<Option<kueue::Priority>, Error> {
    if let Some(name) = job.job.labels().get(kueue::PRIORITY_LABEL) {
        let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &kueue::priority_class_resource());
        let what = format!("reading WorkloadPriorityClass {name}");
        let object = api.get(name).await.map_err(|source| Error::Kueue { what, source })?;
        let value = object.data["value"].as_i64().and_then(|v| i32::try_from(v).ok()).unwrap_or(0);
        return Ok(Some(kueue::Priority { group: kueue::GROUP, name: name.clone(), value }));
    }
    if let Some(name) = &job.spec.run_policy.scheduling.priority_class_name {
        let api = Api::<PriorityClass>::all(ctx.client.clone());
        let what = format!("reading PriorityClass {name}");
        let object = api.get(name).await.map_err(|source| Error::Kueue { what, source })?;
        return Ok(Some(kueue::Priority {
            group: "scheduling.k8s.io",
            name: name.clone(),
            value: object.value,
        }));
    }
    Ok(None)
}

/// Marks the Workload of a finished job `Finished`, so that Kueue releases its quota.
async fn finish_workload(
    job: &ValidatedJob<'_>,
    ctx: &Context,
    status: &TrainingJobStatus,
) -> Result<(), Error> {
    if kueue::queue_name(job).is_none() {
        return Ok(());
    }
    let api = workload_api(job, ctx);
    let name = kueue::workload_name(job.name);
    let what = format!("marking Workload {}/{name} finished", job.namespace);
    let workload = match api.get_opt(&name).await {
        Ok(Some(w)) => w,
        Ok(None) => return Ok(()),
        Err(source) => return Err(Error::Kueue { what, source }),
    };
    if kueue::finished(&workload) {
        return Ok(());
    }
    let succeeded = status.phase == Some(JobPhase::Succeeded);
    let message = if succeeded { "the TrainingJob succeeded" } else { "the TrainingJob failed" };
    let body = kueue::finished_status(&workload, succeeded, message, &Timestamp::now().to_string());
    let params = PatchParams::apply(names::FIELD_MANAGER).force();
    api.patch_status(&name, &params, &Patch::Apply(&body))
        .await
        .map(drop)
        .map_err(|source| Error::Kueue { what, source })
}

/// Reconciles one TrainingJob.
pub async fn reconcile(job: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_job(&job, &ctx).await;
    ctx.metrics.observe(started.elapsed(), result.as_ref().err().map(Error::category));
    if result.is_ok() {
        ctx.failures.clear(&job.uid().unwrap_or_default());
    }
    result
}

async fn reconcile_job(job: &TrainingJob, ctx: &Context) -> Result<Action, Error> {
    let name = job.name_any();
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if let Some(manager) = job.spec.run_policy.managed_by.as_deref()
        && manager != names::MANAGED_BY
    {
        tracing::debug!(job = %name, %manager, "skipping a job managed by another controller");
        return Ok(Action::await_change());
    }
    let raw = job;
    let job = match validate::validate(raw) {
        Ok(job) => job,
        Err(e) => return reject(raw, ctx, &e).await,
    };
    let job = &job;
    let pods = job_pods(job, ctx).await?;
    let lost = lost_nodes(ctx, &pods).await;
    let progress = read_progress(job, ctx, &pods).await;
    let queue = if ctx.kueue { kueue_admission(job, ctx, &pods).await? } else { None };
    let observed = Observed {
        pods: &pods,
        lost_nodes: &lost,
        now: Timestamp::now(),
        progress: progress.as_ref(),
        queue: queue.as_ref(),
    };
    let mut plan = plan::decide(job, &observed, &ctx.settings);
    if ctx.kueue && plan.status.phase.is_some_and(JobPhase::is_finished) {
        finish_workload(job, ctx, &plan.status).await?;
    }
    if matches!(plan.status.phase, Some(JobPhase::Running | JobPhase::Scaling)) {
        plan.requeue_after = plan.requeue_after.min(ctx.progress_every);
    }

    if plan.ensure_children {
        match ensure_children(job, ctx).await {
            Err(e @ Error::Conflict { .. }) => {
                return fail_once(raw, ctx, "NameConflict", e.to_string()).await;
            }
            other => other?,
        }
    }
    sync_pod_group(job, ctx, plan.want_pod_group).await?;
    // Without a restart the plan raises no attempt, so pods may come first: a crash before the
    // status write makes the next reconcile decide the same again. A restart writes the raised
    // attempts first, so that the old pods are stale should the reconcile stop half-way.
    let placement = match &queue {
        Some(kueue::Admission::Admitted { placement, .. }) => Some(placement),
        _ => None,
    };
    let pods_first = plan.restarted.is_empty();
    if pods_first {
        execute(job, ctx, &plan, placement).await?;
    }
    if raw.status.as_ref() != Some(&plan.status) {
        write_status(ctx, job.namespace, job.name, &plan.status).await?;
    }
    let reference = raw.object_ref(&());
    for event in &plan.events {
        publish(&reference, ctx, event.warning, &event.reason, &event.message).await;
    }
    for role in &plan.restarted {
        ctx.metrics.restarts.get_or_create(&RoleLabel { role: role.name().to_owned() }).inc();
    }
    if plan.stalled {
        ctx.metrics.stalls.inc();
    }
    if !pods_first {
        execute(job, ctx, &plan, placement).await?;
    }
    if plan.delete_job {
        tracing::info!(job = %job.name, "deleting finished job: ttlSecondsAfterFinished expired");
        let api = Api::<TrainingJob>::namespaced(ctx.client.clone(), job.namespace);
        delete(&api, job.name, "TrainingJob", &DeleteParams::background()).await?;
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(plan.requeue_after))
}

/// Retries a failed reconcile after [`error_delay`] of the job's failures in a row; the error is
/// logged with its category and the wait.
pub fn error_policy(job: Arc<TrainingJob>, error: &Error, ctx: Arc<Context>) -> Action {
    if error.kube_source().is_some_and(namespace_terminating) {
        // Its namespace is being deleted, and the job with it: nothing to retry.
        tracing::debug!(job = %job.name_any(), error = %error, "namespace being deleted; the job goes with it");
        return Action::await_change();
    }
    let failures = ctx.failures.record(&job.uid().unwrap_or_default());
    let retry_in = error_delay(failures);
    tracing::warn!(
        job = %job.name_any(),
        category = error.category(),
        error = %error,
        failures,
        retry_in_seconds = retry_in.as_secs(),
        "reconcile failed"
    );
    Action::requeue(retry_in)
}

/// Counts the cached jobs by phase.
pub fn count_phases(store: &Store<TrainingJob>) -> Vec<(&'static str, i64)> {
    let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
    for job in store.state() {
        *counts.entry(plan::phase_name(job.status.as_ref().and_then(|s| s.phase))).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// Scope of the controller.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Watch one namespace; `None` watches all.
    pub namespace: Option<String>,
}

fn api_for<K>(client: &Client, scope: &Scope) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match &scope.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Watches the operator's children of kind `K` (labelled as managed by it) into a reflector store,
/// each object passed through `trim` first; returns the store and the stream of touched objects for
/// the controller.
fn watch_owned<K>(
    client: &Client,
    scope: &Scope,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> (Store<K>, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let owned =
        watcher::Config::default().labels(&format!("{}={}", names::LABEL_MANAGED_BY, names::FIELD_MANAGER));
    let (store, writer) = reflector::store::<K>();
    let stream = watcher(api_for::<K>(client, scope), owned)
        .default_backoff()
        .modify(trim)
        .reflect(writer)
        .touched_objects();
    (store, stream)
}

/// `kubectl apply`'s copy of the manifest it applied, kept on the object by the API server.
const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn clear_managed_fields<K: Resource>(object: &mut K) {
    object.managed_fields_mut().clear();
}

/// The TrainingJob controller with its watches set up, ready to run: call
/// [`JobController::run`]. Its store feeds the jobs gauge.
pub struct JobController {
    controller: Controller<TrainingJob>,
    ctx: Arc<Context>,
}

impl std::fmt::Debug for JobController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobController").finish_non_exhaustive()
    }
}

impl JobController {
    /// Sets up the watches on TrainingJobs and their pods, ConfigMaps and Services, whose
    /// caches the reconciles read; at most [`Context::concurrency`] reconciles run at once, each
    /// [`Context::debounce`] after the last event of its job.
    pub fn new(ctx: Arc<Context>, scope: &Scope) -> Self {
        let (pods, pod_stream) = watch_owned::<Pod>(&ctx.client, scope, plan::keep_what_is_read);
        let (config_maps, config_map_stream) =
            watch_owned::<PartialObjectMeta<ConfigMap>>(&ctx.client, scope, clear_managed_fields);
        let (services, service_stream) =
            watch_owned::<PartialObjectMeta<Service>>(&ctx.client, scope, clear_managed_fields);
        let _ = ctx.caches.set(Caches { pods, config_maps, services });
        // The job cache holds every TrainingJob as the reconciles read it, without the bookkeeping
        // of the API server and kubectl that they never read.
        let (jobs, writer) = reflector::store::<TrainingJob>();
        let job_stream = watcher(api_for::<TrainingJob>(&ctx.client, scope), watcher::Config::default())
            .default_backoff()
            .modify(|job| {
                job.metadata.managed_fields = None;
                if let Some(annotations) = job.metadata.annotations.as_mut() {
                    annotations.remove(LAST_APPLIED_ANNOTATION);
                }
            })
            .reflect(writer)
            .applied_objects();
        let mut controller = Controller::for_stream(job_stream, jobs)
            .with_config(
                runtime_controller::Config::default().concurrency(ctx.concurrency).debounce(ctx.debounce),
            )
            .owns_stream(pod_stream)
            .owns_stream(config_map_stream)
            .owns_stream(service_stream);
        if ctx.kueue {
            // Kueue's admissions and evictions arrive as changes of the jobs' Workloads.
            let resource = kueue::workload_resource();
            let api = match &scope.namespace {
                Some(ns) => Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &resource),
                None => Api::<DynamicObject>::all_with(ctx.client.clone(), &resource),
            };
            let owned = watcher::Config::default().labels(&format!(
                "{}={}",
                names::LABEL_MANAGED_BY,
                names::FIELD_MANAGER
            ));
            let stream = watcher(api, owned).default_backoff().touched_objects();
            controller = controller.owns_stream_with(stream, resource);
        }
        Self { controller, ctx }
    }

    /// The cache of TrainingJobs.
    pub fn store(&self) -> Store<TrainingJob> {
        self.controller.store()
    }

    /// Runs until `shutdown` completes; reconciles in flight finish first. Meanwhile, every
    /// [`Context::prune_every`], forgets what is remembered of jobs no longer in the job cache.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
        let (store, ctx) = (self.controller.store(), self.ctx.clone());
        let prune = async move {
            // Until the first list arrives the cache is empty and would prune every job.
            let _ = store.wait_until_ready().await;
            loop {
                tokio::time::sleep(ctx.prune_every).await;
                let live = store.state().iter().filter_map(|job| job.uid()).collect();
                ctx.forget_jobs_except(&live);
            }
        };
        let controller =
            self.controller.graceful_shutdown_on(shutdown).run(reconcile, error_policy, self.ctx).for_each(
                |result| async move {
                    match result {
                        Ok((job, _)) => tracing::debug!(job = %job.name, "reconciled"),
                        Err(e) => tracing::debug!(error = %e, "reconcile did not complete"),
                    }
                },
            );
        tokio::select! {
            () = controller => {}
            () = prune => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_refused_for_a_namespace_being_deleted_is_told_apart_from_a_denial() {
        // The body kube-apiserver answers an Event's creation in a terminating namespace.
        let status = |cause: &str| {
            let body = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403, "reason": "Forbidden",
                "message": "events.events.k8s.io \"j.1\" is forbidden: unable to create new content in namespace n \
                            because it is being terminated",
                "details": {"name": "j.1", "group": "events.k8s.io", "kind": "events",
                            "causes": [{"reason": cause, "message": "namespace n is being terminated",
                                        "field": "metadata.namespace"}]},
            });
            kube::Error::Api(Box::new(serde_json::from_value(body).unwrap()))
        };
        assert!(namespace_terminating(&status("NamespaceTerminating")));
        // A child created as the namespace goes: the reconcile's error says so too.
        let apply = Error::Apply { what: "Service j".into(), source: status("NamespaceTerminating") };
        assert!(apply.kube_source().is_some_and(namespace_terminating));
        // An RBAC denial (no such cause) is still a warning.
        assert!(!namespace_terminating(&status("Other")));
    }

    #[test]
    fn failed_reconciles_back_off_exponentially_up_to_five_minutes() {
        let waits: Vec<u64> = (1..=9).map(|n| error_delay(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(error_delay(u32::MAX), ERROR_BACKOFF_MAX);
    }

    #[test]
    fn failures_count_per_job_and_start_over_after_a_success() {
        let failures = Failures::default();
        assert_eq!((failures.record("a"), failures.record("a"), failures.record("b")), (1, 2, 1));
        failures.clear("a");
        assert_eq!(failures.record("a"), 1);
        failures.retain(&HashSet::from(["b".to_owned()]));
        assert_eq!(failures.uids(), HashSet::from(["b".to_owned()]));
    }
}
