//! The shard state machine on a simulated network: sessions, delivery order and cut links are
//! under the test's control, as in raft-rs.

use std::collections::{HashMap, HashSet, VecDeque};

use tandem_api::job::OptimizerSpec;

use tandem_input::DataCursor;

use super::*;

const TOKEN: &str = "job-token";
/// The run's step count every test worker announces.
const STEPS: u64 = 1000;

fn config(mode: PsMode, replicas: u32, index: u32) -> ShardConfig {
    ShardConfig {
        index,
        replicas,
        mode,
        token: TOKEN.into(),
        checkpoint_every: 0,
        // Plain SGD with rate 1: an update subtracts the (mean) gradient, easy to predict.
        optimizer: OptimizerSpec { learning_rate: 1.0, ..OptimizerSpec::default() },
        max_total_len: 1 << 20,
        groups: 2,
        bounds: JobBounds::loose(),
    }
}

/// The shard plus every session's inbox; frames are delivered when the test says so.
struct Net {
    shard: ShardState,
    inbox: HashMap<SessionId, VecDeque<Frame>>,
    closed: HashSet<SessionId>,
    checkpoints: usize,
    nonces: HashMap<SessionId, [u8; NONCE_LEN]>,
}

impl Net {
    fn new(config: ShardConfig) -> Self {
        Self {
            shard: ShardState::new(config),
            inbox: HashMap::new(),
            closed: HashSet::new(),
            checkpoints: 0,
            nonces: HashMap::new(),
        }
    }

    /// Connects session `s`, which the shard challenges with a nonce of its own.
    fn connect(&mut self, s: SessionId) {
        let nonce = [s as u8 ^ 0x5a; NONCE_LEN];
        let outs = self.shard.connect(s, nonce);
        assert!(
            matches!(&outs[..], [Output::Send(to, Frame::Challenge { nonce: n })] if *to == s && *n == nonce)
        );
        self.nonces.insert(s, nonce);
    }

    /// The hello of a client of `token` on session `s`, proving it over the session's challenge.
    fn hello(&self, s: SessionId, token: &str, peer: Peer, total_len: u64, total_steps: u64) -> Frame {
        let challenge = self.nonces.get(&s).copied().unwrap_or_default();
        let nonce = [s as u8 ^ 0x3c; NONCE_LEN];
        let proof = hello_proof(token.as_bytes(), &challenge, &nonce, peer, total_len, total_steps);
        Frame::Hello { proof, nonce, peer, total_len, total_steps }
    }

    fn apply(&mut self, outs: Vec<Output>) {
        for o in outs {
            match o {
                Output::Send(s, f) => self.inbox.entry(s).or_default().push_back(f),
                Output::Close(s) => {
                    self.closed.insert(s);
                    let more = self.shard.disconnect(s);
                    self.apply(more);
                }
                Output::Checkpoint => self.checkpoints += 1,
            }
        }
    }

    fn send(&mut self, s: SessionId, frame: Frame) {
        assert!(!self.closed.contains(&s), "session {s} was closed");
        let outs = self.shard.handle(s, frame);
        self.apply(outs);
    }

    fn cut(&mut self, s: SessionId) {
        self.closed.insert(s);
        let outs = self.shard.disconnect(s);
        self.apply(outs);
    }

    fn take(&mut self, s: SessionId) -> Vec<Frame> {
        self.inbox.remove(&s).map(Vec::from).unwrap_or_default()
    }

    /// Sends `frame` and returns the single reply it produced right away.
    fn call(&mut self, s: SessionId, frame: Frame) -> Frame {
        self.send(s, frame);
        let mut got = self.take(s);
        assert_eq!(got.len(), 1, "expected one reply, got {got:?}");
        got.remove(0)
    }

    fn worker(&mut self, s: SessionId, group: u32, rank: u32, attempt: u32, total: u64) {
        self.connect(s);
        let hello = self.hello(s, TOKEN, Peer::Worker { group, rank, attempt }, total, STEPS);
        assert!(matches!(self.call(s, hello), Frame::Welcome { .. }));
    }

    fn joined_worker(&mut self, s: SessionId, group: u32, total: u64, init: &[f32]) {
        self.worker(s, group, 0, 0, total);
        let start = self.range().start;
        assert!(matches!(
            self.call(s, Frame::Init { offset: start, values: init.to_vec() }),
            Frame::Ack { .. }
        ));
        assert!(matches!(self.call(s, Frame::Join), Frame::Joined { .. }));
    }

    fn range(&self) -> Range<u64> {
        self.shard.status().range
    }

    /// Pushes `values` at `offset` as session `s`'s group's next step here, as a worker does:
    /// the step after its last whole contribution.
    fn push(&mut self, s: SessionId, offset: u64, values: Vec<f32>) -> Frame {
        let group = match self.shard.sessions.get(&s).and_then(|x| x.peer) {
            Some(Peer::Worker { group, .. }) => Some(group),
            _ => None,
        };
        let step = group.and_then(|g| self.shard.groups.get(&g)).and_then(|g| g.contributed).unwrap_or(0);
        self.call(s, Frame::Push { offset, step, values })
    }

    /// Sends a pull and returns the weights if it was answered at once.
    fn pull(&mut self, s: SessionId, offset: u64, len: u64) -> Option<Vec<f32>> {
        self.send(s, Frame::Pull { offset, len });
        self.weights(s)
    }

    fn weights(&mut self, s: SessionId) -> Option<Vec<f32>> {
        let mut got = self.take(s);
        match got.pop() {
            Some(Frame::Weights { values, .. }) => Some(values),
            None => None,
            Some(other) => panic!("expected weights, got {other:?}"),
        }
    }
}

fn is_error(frame: &Frame, want: ErrorCode) -> bool {
    matches!(frame, Frame::Error { code, .. } if *code == want)
}

#[test]
fn frames_before_hello_and_wrong_tokens_are_refused_and_others_keep_working() {
    let mut net = Net::new(config(PsMode::Async { staleness: None }, 1, 0));
    net.joined_worker(1, 0, 2, &[1.0, 2.0]);

    net.connect(2);
    net.send(2, Frame::Pull { offset: 0, len: 2 });
    assert!(is_error(&net.take(2)[0], ErrorCode::Unauthenticated));
    assert!(net.closed.contains(&2), "an unauthenticated session is closed");

    net.connect(3);
    let bad = net.hello(3, "guess", Peer::Observer, 0, 0);
    assert!(is_error(&net.call(3, bad), ErrorCode::Unauthenticated));
    assert!(net.closed.contains(&3));

    // A proof covers its own connection's challenge: replayed on another connection, refused.
    net.connect(9);
    let replayed = net.hello(1, TOKEN, Peer::Observer, 0, 0);
    assert!(is_error(&net.call(9, replayed), ErrorCode::Unauthenticated));
    assert!(net.closed.contains(&9));

    net.connect(4);
    let outs = net.shard.refuse_wire(4, &WireError::BadMagic { found: *b"GE" });
    net.apply(outs);
    assert!(net.closed.contains(&4), "a frame whose stream cannot be followed closes the session");
    let outs = net.shard.refuse_wire(1, &WireError::UnknownKind(0x42));
    net.apply(outs);
    assert!(is_error(&net.take(1)[0], ErrorCode::UnknownFrame));
    assert!(!net.closed.contains(&1), "an unknown kind is answered and the session goes on");

    assert!(matches!(net.push(1, 0, vec![0.5, 0.5]), Frame::Ack { version: 1, clock: 1 }));
    assert_eq!(net.pull(1, 0, 2), Some(vec![0.5, 1.5]));
    assert_eq!(net.shard.status().refused, 5);
}

#[test]
fn a_hello_longer_than_the_plan_allows_is_refused_before_the_shard_is_sized() {
    let mut net = Net::new(config(PsMode::Sync, 1, 0));
    net.connect(1);
    let worker = Peer::Worker { group: 0, rank: 0, attempt: 0 };
    // 2^62 values: once a capacity-overflow panic of the shard task, 2^34 an abort on allocation.
    for (s, absurd) in [(1, 1u64 << 62), (2, 1 << 34)] {
        net.connect(s);
        let hello = net.hello(s, TOKEN, worker, absurd, STEPS);
        let reply = net.call(s, hello);
        assert!(
            matches!(&reply, Frame::Error { code: ErrorCode::Mismatch, message } if message.contains(&format!("{absurd}-value")) && message.contains("at most 1048576")),
            "{reply:?}"
        );
        assert!(net.closed.contains(&s));
    }
    assert_eq!(net.shard.status().total_len, 0, "nothing was sized");
    // The plan's own length is served.
    net.worker(3, 0, 0, 0, 1 << 20);
    assert_eq!(net.shard.status().total_len, 1 << 20);
}

#[test]
fn the_welcome_proves_the_token_over_both_nonces_and_the_layout() {
    let mut net = Net::new(config(PsMode::Sync, 2, 1));
    net.worker(1, 0, 0, 0, 5);
    net.connect(2);
    let hello = net.hello(2, TOKEN, Peer::Observer, 0, 0);
    let Frame::Hello { nonce: client, .. } = hello.clone() else { unreachable!() };
    let Frame::Welcome { proof, shard, replicas, start, end, total_len, total_steps, .. } =
        net.call(2, hello)
    else {
        panic!("welcome expected")
    };
    let challenge = net.nonces[&2];
    let layout = [u64::from(shard), u64::from(replicas), start, end, total_len, total_steps];
    assert_eq!(layout, [1, 2, 3, 5, 5, STEPS]);
    assert_eq!(proof, welcome_proof(TOKEN.as_bytes(), &challenge, &client, layout));
    assert_ne!(proof, welcome_proof(b"another-token", &challenge, &client, layout));
}

#[test]
fn observers_read_status_and_weights_but_cannot_write() {
    let mut net = Net::new(config(PsMode::Sync, 2, 1));
    net.joined_worker(1, 0, 5, &[7.0, 8.0]);
    net.connect(2);
    let hello = net.hello(2, TOKEN, Peer::Observer, 0, 0);
    assert!(matches!(net.call(2, hello), Frame::Welcome { shard: 1, start: 3, end: 5, total_len: 5, .. }));
    assert!(is_error(&net.push(2, 3, vec![1.0, 1.0]), ErrorCode::Protocol));
    assert_eq!(net.pull(2, 3, 2), Some(vec![7.0, 8.0]));
    net.send(
        1,
        Frame::Report(Progress {
            step: 9,
            loss: Some(0.5),
            accuracy: Some(0.75),
            samples: 10,
            epoch: 0,
            ..Progress::default()
        }),
    );
    net.take(1);
    let Frame::Status(json) = net.call(2, Frame::StatusRequest) else { panic!("status expected") };
    let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
    assert_eq!(v["progress"]["step"], 9);
    assert_eq!(v["progress"]["accuracy"], 0.75);
    assert_eq!(v["groups"][0]["member"], true);
    assert_eq!(v["mode"]["kind"], "sync");
}

#[test]
fn a_client_with_another_model_size_is_refused() {
    let mut net = Net::new(config(PsMode::Sync, 1, 0));
    net.worker(1, 0, 0, 0, 10);
    net.connect(2);
    let hello = net.hello(2, TOKEN, Peer::Worker { group: 1, rank: 0, attempt: 0 }, 11, STEPS);
    assert!(is_error(&net.call(2, hello), ErrorCode::Mismatch));
    assert!(net.closed.contains(&2));
}

#[test]
fn ranges_outside_the_shard_and_workers_of_another_run_are_refused() {
    let mut net = Net::new(config(PsMode::Sync, 2, 0));
    net.joined_worker(1, 0, 4, &[1.0, 1.0]);
    // Each refused, and its session closed: a peer that sends one is broken.
    assert!(is_error(&net.push(1, 1, vec![1.0, 1.0]), ErrorCode::BadRange));
    assert!(net.closed.remove(&1));
    net.worker(3, 0, 0, 0, 4);
    assert!(is_error(&net.call(3, Frame::Pull { offset: 0, len: 0 }), ErrorCode::BadRange));
    assert!(net.closed.remove(&3));
    // A worker must say how long its run is.
    net.connect(2);
    let none = net.hello(2, TOKEN, Peer::Worker { group: 1, rank: 0, attempt: 0 }, 4, 0);
    assert!(is_error(&net.call(2, none), ErrorCode::Mismatch), "a run of 0 steps");
    assert!(net.closed.remove(&2));
}

#[test]
fn a_worker_whose_plan_counts_other_steps_is_welcomed_with_the_runs_length() {
    // A group added by scaling an `epochs` job splits each epoch over more ranks, so its own
    // plan has fewer steps: it is told the job's, and the schedule keeps its length.
    let mut net = Net::new(config(PsMode::Sync, 1, 0));
    net.joined_worker(1, 0, 4, &[1.0, 1.0, 1.0, 1.0]);
    net.connect(2);
    let fewer = net.hello(2, TOKEN, Peer::Worker { group: 1, rank: 0, attempt: 0 }, 4, STEPS * 2 / 3);
    let Frame::Welcome { total_steps, .. } = net.call(2, fewer) else { panic!("welcome expected") };
    assert_eq!(total_steps, STEPS);
    assert!(!net.closed.contains(&2));
}

#[test]
fn sync_waits_for_every_member_then_applies_the_mean() {
    let mut net = Net::new(config(PsMode::Sync, 1, 0));
    net.joined_worker(1, 0, 2, &[0.0, 0.0]);
    net.joined_worker(2, 1, 2, &[9.0, 9.0]);
    // The second init is ignored: the first one made the shard ready.
    assert_eq!(net.pull(1, 0, 2), Some(vec![0.0, 0.0]));

    assert!(matches!(net.push(1, 0, vec![2.0, 4.0]), Frame::Ack { version: 0, clock: 1 }));
    assert_eq!(net.pull(1, 0, 2), None, "group 0 waits for group 1");
    assert!(is_error(&net.push(1, 0, vec![1.0, 1.0]), ErrorCode::Protocol), "one contribution per step");
    net.push(2, 0, vec![4.0, 0.0]);
    assert_eq!(net.weights(1), Some(vec![-3.0, -2.0]), "mean gradient (3, 2) applied once");
    assert_eq!(net.pull(2, 0, 2), Some(vec![-3.0, -2.0]));
    assert_eq!(net.shard.version(), 1);
}

#[test]
fn sync_counts_a_contribution_only_when_the_group_covers_the_shard() {
    // One group of two ranks, each pushing half of a 4-value shard (after a reduce-scatter).
    let mut net = Net::new(config(PsMode::Sync, 1, 0));
    net.joined_worker(1, 0, 4, &[0.0; 4]);
    net.worker(2, 0, 1, 0, 4);
    net.push(1, 0, vec![1.0, 1.0]);
    assert_eq!(net.pull(1, 0, 2), None, "rank 0 waits for its group's other half");
    assert_eq!(net.pull(2, 2, 2), Some(vec![0.0, 0.0]), "a range the group has not pushed reads at once");
    assert!(is_error(&net.push(2, 1, vec![5.0, 5.0]), ErrorCode::Protocol), "overlap refused");
    net.push(2, 2, vec![2.0, 2.0]);
    assert_eq!(net.weights(1), Some(vec![-1.0, -1.0]));
    assert_eq!(net.pull(2, 2, 2), Some(vec![-2.0, -2.0]));
}

#[test]
fn sync_membership_changes_at_step_boundaries() {
    let mut net = Net::new(config(PsMode::Sync, 1, 0));
    net.joined_worker(1, 0, 1, &[0.0]);
    net.joined_worker(2, 1, 1, &[0.0]);
    net.push(1, 0, vec![1.0]);
    assert_eq!(net.pull(1, 0, 1), None);
    // Group 1 leaves mid-step: the step completes with group 0 alone.
    assert_eq!(net.call(2, Frame::Leave), Frame::Left);
    assert_eq!(net.weights(1), Some(vec![-1.0]));

    // A new group joins at the current step and is waited for from then on.
    net.joined_worker(3, 2, 1, &[0.0]);
    assert_eq!(net.pull(3, 0, 1), Some(vec![-1.0]), "a joining group pulls the current weights");
    net.push(1, 0, vec![1.0]);
    assert_eq!(net.pull(1, 0, 1), None, "group 0 now waits for the newcomer");
    net.push(3, 0, vec![3.0]);
    assert_eq!(net.weights(1), Some(vec![-3.0]));

    // Cutting every link of a group is leaving.
    net.push(1, 0, vec![1.0]);
    assert_eq!(net.pull(1, 0, 1), None);
    net.cut(3);
    assert_eq!(net.weights(1), Some(vec![-4.0]));
    assert!(!net.shard.status().groups.iter().any(|g| g.group == 2 && g.member));
}

#[test]
fn a_restarted_group_replaces_its_earlier_attempt() {
    let mut net = Net::new(config(PsMode::Sync, 1, 0));
    net.joined_worker(1, 0, 2, &[0.0, 0.0]);
    net.worker(2, 0, 1, 0, 2);
    net.joined_worker(3, 1, 2, &[0.0, 0.0]);
    net.push(1, 0, vec![8.0]); // half a contribution, then the group dies and restarts
    net.worker(4, 0, 0, 1, 2);
    assert!(net.closed.contains(&1) && net.closed.contains(&2), "old attempt's sessions closed");
    net.connect(5);
    let stale = net.hello(5, TOKEN, Peer::Worker { group: 0, rank: 1, attempt: 0 }, 2, STEPS);
    assert!(is_error(&net.call(5, stale), ErrorCode::Protocol), "an older attempt is refused");
    assert!(matches!(net.call(4, Frame::Join), Frame::Joined { clock: 0, version: 0 }));
    net.push(3, 0, vec![2.0, 2.0]);
    net.push(4, 0, vec![4.0, 4.0]);
    assert_eq!(net.pull(4, 0, 2), Some(vec![-3.0, -3.0]), "the dead attempt's half push was dropped");
}

#[test]
fn a_groups_last_whole_contribution_is_kept_across_its_restart() {
    let mut net = Net::new(config(PsMode::Async { staleness: None }, 1, 0));
    net.joined_worker(1, 0, 2, &[0.0, 0.0]);
    net.worker(2, 0, 1, 0, 2);
    let contributed = |net: &Net| net.shard.status().groups[0].contributed;
    assert_eq!(contributed(&net), None, "nothing pushed yet");
    for step in 0..2 {
        net.call(1, Frame::Push { offset: 0, step, values: vec![1.0] });
        let before = (step > 0).then_some(step);
        assert_eq!(contributed(&net), before, "half of step {step} is not a whole contribution");
        net.call(2, Frame::Push { offset: 1, step, values: vec![1.0] });
        assert_eq!(contributed(&net), Some(step + 1), "both halves of step {step} arrived");
    }
    // Half of step 2, then the group dies: the shard still counts 2 whole steps, after the
    // restart too, where the new attempt continues.
    net.call(1, Frame::Push { offset: 0, step: 2, values: vec![1.0] });
    net.worker(3, 0, 0, 1, 2);
    assert_eq!(contributed(&net), Some(2));
    assert!(matches!(net.call(3, Frame::Join), Frame::Joined { .. }));
    net.call(3, Frame::Push { offset: 0, step: 2, values: vec![1.0, 1.0] });
    assert_eq!(contributed(&net), Some(3));
    // A step beyond the run is refused, not recorded: the group's later steps would be taken for
    // repeated ones, and the checkpoint's restore would refuse the record.
    let beyond = net.call(3, Frame::Push { offset: 0, step: u64::MAX, values: vec![1.0, 1.0] });
    assert!(is_error(&beyond, ErrorCode::OutOfBounds), "{beyond:?}");
    assert_eq!(contributed(&net), Some(3));
}

#[test]
fn a_step_that_reached_the_shard_whole_before_a_restart_is_applied_once_and_moves_the_clock() {
    for mode in [PsMode::Async { staleness: None }, PsMode::Elastic { alpha: 0.5, tau: 1 }] {
        let mut net = Net::new(config(mode, 1, 0));
        net.joined_worker(1, 0, 1, &[0.0]);
        for step in 0..2 {
            net.call(1, Frame::Push { offset: 0, step, values: vec![1.0] });
        }
        let applied = net.shard.snapshot().unwrap();
        assert_eq!(applied.version, 2, "{mode:?}");
        // The group dies after step 1 reached this shard but not another, and its next attempt,
        // continuing at the other shard's step 1, trains step 1 again.
        net.cut(1);
        net.worker(2, 0, 0, 1, 1);
        let Frame::Joined { clock: joined, .. } = net.call(2, Frame::Join) else { panic!("join refused") };
        let ack = net.call(2, Frame::Push { offset: 0, step: 1, values: vec![1.0] });
        assert!(
            matches!(ack, Frame::Ack { version: 2, clock } if clock == joined + 1),
            "{mode:?}: the repeated step moves the clock and applies nothing: {ack:?}"
        );
        let again = net.shard.snapshot().unwrap();
        assert_eq!((again.version, &again.values), (2, &applied.values), "{mode:?}: step 1 applied twice");
        // Its next step is new here, and applied.
        net.call(2, Frame::Push { offset: 0, step: 2, values: vec![1.0] });
        assert_eq!(net.shard.version(), 3, "{mode:?}");
        assert_eq!(net.shard.status().groups[0].contributed, Some(3), "{mode:?}");
    }
}

/// Two groups on two shards under a staleness bound of 0; shard 1 restarts from a checkpoint
/// that lacks steps shard 0 applied, one group ahead of the other there. Both groups continue at
/// the least of their shards' whole steps and retrain: each shard applies each step once, and
/// the clocks the bound compares stay equal, so no pull waits on a group that already pushed.
#[test]
fn after_a_shard_restarts_the_retrained_steps_apply_once_on_every_shard_and_no_group_waits() {
    let mode = PsMode::Async { staleness: Some(0) };
    let mut shards = [Net::new(config(mode, 2, 0)), Net::new(config(mode, 2, 1))];
    // Session `10 × attempt + group` is the group's (single rank's) connection to each shard.
    for net in &mut shards {
        for group in 0..2 {
            net.joined_worker(u64::from(group), group, 2, &[0.0]);
        }
    }
    // Pushes `step` of `group`'s attempt to both shards and pulls both ranges back.
    let step = |shards: &mut [Net; 2], s: SessionId, step: u64| {
        for (i, net) in shards.iter_mut().enumerate() {
            net.take(s);
            let ack = net.call(s, Frame::Push { offset: i as u64, step, values: vec![1.0] });
            assert!(matches!(ack, Frame::Ack { .. }), "shard {i}, session {s}, step {step}: {ack:?}");
            net.send(s, Frame::Pull { offset: i as u64, len: 1 });
        }
    };
    // Whether every pull sent so far by `sessions` was answered.
    let answered = |shards: &mut [Net; 2], sessions: &[SessionId]| {
        let pending: Vec<(usize, SessionId)> = (0..2)
            .flat_map(|i| sessions.iter().map(move |&s| (i, s)))
            .filter(|&(i, s)| shards[i].shard.waiting.iter().any(|w| w.session == s))
            .collect();
        for net in shards.iter_mut() {
            for &s in sessions {
                net.take(s);
            }
        }
        pending
    };
    for k in 0..2 {
        step(&mut shards, 0, k);
        step(&mut shards, 1, k);
        assert_eq!(answered(&mut shards, &[0, 1]), vec![], "step {k}");
    }
    let checkpoint = shards[1].shard.snapshot().unwrap();
    assert_eq!(checkpoint.contributed, vec![(0, 2), (1, 2)]);
    // Group 0 trains steps 2 and 3, group 1 step 2, everywhere; then shard 1 is killed and
    // restarts from its checkpoint, and both groups restart.
    step(&mut shards, 0, 2);
    step(&mut shards, 1, 2);
    step(&mut shards, 0, 3);
    let cfg = shards[1].shard.config().clone();
    shards[1] = Net { shard: ShardState::restore(cfg.clone(), checkpoint).unwrap(), ..Net::new(cfg) };
    for s in [0, 1] {
        shards[0].cut(s);
    }
    for net in &mut shards {
        for group in 0..2 {
            net.worker(10 + u64::from(group), group, 0, 1, 2);
        }
    }
    let resume: Vec<u64> = (0..2)
        .map(|g| shards.iter().filter_map(|n| n.shard.status().groups[g].contributed).min().unwrap())
        .collect();
    assert_eq!(resume, [2, 2], "each group continues at the least of its shards' whole steps");
    for net in &mut shards {
        for s in [10, 11] {
            assert!(matches!(net.call(s, Frame::Join), Frame::Joined { .. }));
        }
    }
    for k in 2..6 {
        step(&mut shards, 10, k);
        step(&mut shards, 11, k);
        assert_eq!(answered(&mut shards, &[10, 11]), vec![], "step {k}: a pull waits (shard, session)");
    }
    // Six steps of two groups, each applied once with rate 1 and gradient 1, on each shard.
    for (i, net) in shards.iter().enumerate() {
        let snap = net.shard.snapshot().unwrap();
        assert_eq!(snap.values, vec![-12.0], "shard {i}");
        assert_eq!(snap.contributed, vec![(0, 6), (1, 6)], "shard {i}");
    }
}

#[test]
fn shard_0_fixes_each_epochs_group_count_once_and_keeps_it_across_a_restart() {
    let mut cfg = config(PsMode::Async { staleness: None }, 1, 0);
    cfg.checkpoint_every = 1000;
    let mut net = Net::new(cfg.clone());
    net.joined_worker(1, 0, 1, &[0.0]);
    let plan = |net: &mut Net, s: SessionId, epoch: u64| match net.call(s, Frame::GetEpochs { epoch }) {
        Frame::Epochs { groups } => groups,
        other => panic!("expected the epoch plan, got {other:?}"),
    };
    // The config's 2 groups split epochs 0 and 1, fixed when first asked for (and kept at once).
    assert_eq!(plan(&mut net, 1, 1), vec![2, 2]);
    assert_eq!(net.checkpoints, 1, "a newly fixed epoch is checkpointed");
    // Scaled to 3: the epochs already fixed keep 2, the next takes 3; asking again changes nothing.
    net.shard.set_planned_groups(3);
    assert_eq!(plan(&mut net, 1, 0), vec![2]);
    assert_eq!(plan(&mut net, 1, 2), vec![2, 2, 3]);
    assert_eq!(net.checkpoints, 2);
    net.shard.set_planned_groups(1);
    assert_eq!(plan(&mut net, 1, 2), vec![2, 2, 3], "a fixed epoch never changes");
    assert_eq!(net.checkpoints, 2, "nothing new to keep");
    // A group the config read here does not count yet (the config reaches this server later)
    // is counted in the epochs it asks to fix.
    net.worker(2, 4, 0, 0, 1);
    assert_eq!(plan(&mut net, 2, 3), vec![2, 2, 3, 5]);
    assert_eq!(net.shard.status().epochs, vec![2, 2, 3, 5]);
    // Refused, not allocated: an epoch beyond any run.
    let absurd = net.call(1, Frame::GetEpochs { epoch: u64::MAX });
    assert!(is_error(&absurd, ErrorCode::BadRange), "{absurd:?}");
    // A restored shard 0 has the plan.
    let snapshot = net.shard.snapshot().unwrap();
    let mut restored =
        Net { shard: ShardState::restore(cfg, snapshot).unwrap(), ..Net::new(config(PsMode::Sync, 1, 0)) };
    restored.worker(3, 0, 0, 1, 1);
    assert_eq!(plan(&mut restored, 3, 4), vec![2, 2, 3, 5, 2]);
    // Only shard 0 holds it.
    let mut other = Net::new(config(PsMode::Async { staleness: None }, 2, 1));
    other.worker(1, 0, 0, 0, 2);
    let refused = other.call(1, Frame::GetEpochs { epoch: 0 });
    assert!(
        matches!(&refused, Frame::Error { code: ErrorCode::Protocol, message } if message.contains("shard 0")),
        "{refused:?}"
    );
}

#[test]
fn a_group_count_posted_by_the_operator_is_not_raised_by_a_group_being_removed() {
    // Three groups, scaled down to two: the operator posts 2 while group 2's pods still drain.
    let mut cfg = config(PsMode::Async { staleness: None }, 1, 0);
    cfg.groups = 3;
    let mut net = Net::new(cfg);
    net.worker(1, 0, 0, 0, 1);
    net.worker(2, 2, 0, 0, 1);
    let plan = |net: &mut Net, s: SessionId, epoch: u64| match net.call(s, Frame::GetEpochs { epoch }) {
        Frame::Epochs { groups } => groups,
        other => panic!("expected the epoch plan, got {other:?}"),
    };
    assert_eq!(plan(&mut net, 1, 0), vec![3]);
    net.shard.post_groups(2);
    assert!(net.shard.groups_posted());
    // The leaving group asks first: the epoch is still the two groups' left, not three again.
    assert_eq!(plan(&mut net, 2, 1), vec![3, 2], "a removed group sits the epoch out");
    assert_eq!(plan(&mut net, 1, 2), vec![3, 2, 2]);
    // Scaled up again: the operator posts before the new group's pods exist.
    net.shard.post_groups(4);
    assert_eq!(plan(&mut net, 2, 3), vec![3, 2, 2, 4]);
}

#[test]
fn async_applies_every_contribution_at_once() {
    let mut net = Net::new(config(PsMode::Async { staleness: None }, 1, 0));
    net.joined_worker(1, 0, 1, &[0.0]);
    net.joined_worker(2, 1, 1, &[0.0]);
    for _ in 0..5 {
        net.push(1, 0, vec![1.0]);
        assert!(net.pull(1, 0, 1).is_some(), "unbounded async never waits");
    }
    assert_eq!(net.pull(2, 0, 1), Some(vec![-5.0]));
    assert_eq!(net.shard.version(), 5);
}

#[test]
fn bounded_staleness_holds_back_a_group_too_far_ahead() {
    let mut net = Net::new(config(PsMode::Async { staleness: Some(1) }, 1, 0));
    net.joined_worker(1, 0, 1, &[0.0]);
    net.joined_worker(2, 1, 1, &[0.0]);
    net.push(1, 0, vec![1.0]);
    assert!(net.pull(1, 0, 1).is_some(), "one step ahead is within s = 1");
    net.push(1, 0, vec![1.0]);
    assert_eq!(net.pull(1, 0, 1), None, "two steps ahead of the slowest waits");
    net.push(2, 0, vec![1.0]);
    assert_eq!(net.weights(1), Some(vec![-3.0]), "released when the slowest advances");
    // The slow group leaving also releases: only members count.
    net.push(1, 0, vec![1.0]);
    net.push(1, 0, vec![1.0]);
    assert_eq!(net.pull(1, 0, 1), None);
    net.call(2, Frame::Leave);
    assert_eq!(net.weights(1), Some(vec![-5.0]));
}

#[test]
fn a_group_joining_late_starts_at_the_slowest_clock() {
    let mut net = Net::new(config(PsMode::Async { staleness: Some(0) }, 1, 0));
    net.joined_worker(1, 0, 1, &[0.0]);
    for _ in 0..3 {
        net.push(1, 0, vec![1.0]);
        assert!(net.pull(1, 0, 1).is_some());
    }
    net.worker(2, 1, 0, 0, 1);
    assert!(matches!(net.call(2, Frame::Join), Frame::Joined { clock: 3, version: 3 }));
    assert_eq!(net.pull(2, 0, 1), Some(vec![-3.0]), "the newcomer does not stall anyone");
}

#[test]
fn elastic_pushes_move_the_centre_by_the_difference() {
    let mut net = Net::new(config(PsMode::Elastic { alpha: 0.5, tau: 1 }, 1, 0));
    net.joined_worker(1, 0, 2, &[1.0, 1.0]);
    net.joined_worker(2, 1, 2, &[0.0, 0.0]);
    // Worker x = (3, 1), α = 0.5: e = α(x − centre) = (1, 0); centre += e.
    let alpha = 0.5;
    let centre = net.pull(1, 0, 2).unwrap_or_default();
    let x = [3.0f32, 1.0];
    let e: Vec<f32> = x.iter().zip(&centre).map(|(x, c)| alpha * (x - c)).collect();
    net.push(1, 0, e);
    assert_eq!(net.pull(2, 0, 2), Some(vec![2.0, 1.0]));
    net.push(2, 0, vec![-1.0, 0.5]);
    assert_eq!(net.pull(1, 0, 2), Some(vec![1.0, 1.5]));
}

#[test]
fn pulls_wait_for_initial_weights_and_pushes_before_them_are_refused() {
    let mut net = Net::new(config(PsMode::Sync, 1, 0));
    net.worker(1, 0, 0, 0, 4);
    net.worker(2, 1, 0, 0, 4);
    assert!(matches!(net.call(2, Frame::Join), Frame::Joined { .. }));
    assert_eq!(net.pull(2, 0, 4), None, "no weights yet");
    assert!(is_error(&net.push(2, 0, vec![0.0; 4]), ErrorCode::Protocol));
    net.call(1, Frame::Init { offset: 2, values: vec![3.0, 4.0] });
    assert_eq!(net.weights(2), None);
    net.call(1, Frame::Init { offset: 0, values: vec![1.0, 2.0] });
    assert_eq!(net.weights(2), Some(vec![1.0, 2.0, 3.0, 4.0]));
}

#[test]
fn checkpoints_are_requested_every_n_updates_and_restore_the_same_shard() {
    let mut cfg = config(PsMode::Async { staleness: None }, 2, 1);
    cfg.checkpoint_every = 3;
    cfg.optimizer.momentum = 0.9;
    let mut net = Net::new(cfg.clone());
    net.joined_worker(1, 0, 5, &[1.0, 1.0]);
    for i in 0..7 {
        net.push(1, 3, vec![i as f32, 1.0]);
    }
    assert_eq!(net.checkpoints, 2);
    let snap = net.shard.snapshot();
    let Some(snap) = snap else { panic!("a ready shard has a snapshot") };
    assert_eq!(snap.version, 7);
    let mut resumed = Net {
        shard: ShardState::restore(cfg.clone(), snap.clone()).unwrap_or_else(|e| panic!("{e}")),
        ..Net::new(cfg.clone())
    };
    resumed.joined_worker(1, 0, 5, &[0.0, 0.0]);
    net.push(1, 3, vec![1.0, 1.0]);
    resumed.push(1, 3, vec![1.0, 1.0]);
    assert_eq!(net.pull(1, 3, 2), resumed.pull(1, 3, 2), "momentum survives the restore");

    let mut other = cfg.clone();
    other.index = 0;
    assert!(matches!(ShardState::restore(other, snap.clone()), Err(RestoreError::WrongShard { .. })));
    let mut short = snap;
    short.values.pop();
    assert!(matches!(ShardState::restore(cfg, short), Err(RestoreError::WrongLength { .. })));
}

/// A tiny deterministic generator for delivery orders (xorshift64*).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// Groups of two ranks run `steps` push-then-pull steps with every interleaving the generator
/// picks; the staleness bound must hold at every answered pull and nothing may deadlock.
fn run_random_schedule(mode: PsMode, groups: u32, steps: u64, seed: u64) -> Vec<f32> {
    let mut net = Net::new(config(mode, 1, 0));
    let total = 6u64;
    let half = total / 2;
    let session = |g: u32, r: u32| u64::from(g * 2 + r + 1);
    for g in 0..groups {
        for r in 0..2 {
            net.worker(session(g, r), g, r, 0, total);
            net.call(
                session(g, r),
                Frame::Init { offset: u64::from(r) * half, values: vec![0.0; half as usize] },
            );
        }
        net.call(session(g, 0), Frame::Join);
    }
    // Per rank: steps finished, and whether its pull of the current step is unanswered.
    let mut done = vec![0u64; (groups * 2) as usize];
    let mut waiting = vec![false; (groups * 2) as usize];
    let mut rng = Rng(seed | 1);
    let staleness = match mode {
        PsMode::Async { staleness } => staleness,
        PsMode::Sync => Some(0),
        PsMode::Elastic { .. } => None,
    };
    loop {
        // A rank may not start step k+1 before its partner finished step k (the allgather).
        let partner = |i: usize| i ^ 1;
        let ready: Vec<usize> = (0..done.len())
            .filter(|&i| !waiting[i] && done[i] < steps && done[i] <= done[partner(i)])
            .collect();
        if ready.is_empty() {
            assert!(waiting.iter().all(|w| !w), "deadlock: pulls still waiting with no one able to move");
            break;
        }
        let i = ready[rng.below(ready.len())];
        let (g, r) = (i as u32 / 2, i as u32 % 2);
        let s = session(g, r);
        let grad = vec![1.0 + g as f32; half as usize];
        assert!(matches!(net.push(s, u64::from(r) * half, grad), Frame::Ack { .. }));
        waiting[i] = true;
        net.send(s, Frame::Pull { offset: u64::from(r) * half, len: half });
        for j in 0..done.len() {
            let sj = session(j as u32 / 2, j as u32 % 2);
            if waiting[j] && net.weights(sj).is_some() {
                waiting[j] = false;
                done[j] += 1;
                let st = net.shard.status();
                let clock = |gi: u32| st.groups.iter().find(|x| x.group == gi).map_or(0, |x| x.clock);
                let min = (0..groups).map(clock).min().unwrap_or(0);
                if let Some(s) = staleness {
                    assert!(clock(j as u32 / 2) - min <= s, "pull answered beyond staleness {s}");
                }
            }
        }
    }
    assert_eq!(done, vec![steps; done.len()]);
    net.pull(1, 0, half).into_iter().chain(net.pull(2, half, half)).flatten().collect()
}

#[test]
fn random_interleavings_keep_the_staleness_bound_and_lose_no_update() {
    for seed in 1..40 {
        let groups = 3;
        let steps = 6;
        // Every update subtracts the group's gradient (1 + g) in async mode: the sum is order-free.
        let want = -((0..groups).map(|g| 1.0 + g as f32).sum::<f32>() * steps as f32);
        for s in [Some(0), Some(1), Some(3), None] {
            let w = run_random_schedule(PsMode::Async { staleness: s }, groups, steps, seed);
            assert!(w.iter().all(|&v| v == want), "async s={s:?} seed {seed}: {w:?} != {want}");
        }
        // Sync applies the mean per step.
        let mean = (0..groups).map(|g| 1.0 + g as f32).sum::<f32>() / groups as f32;
        let w = run_random_schedule(PsMode::Sync, groups, steps, seed);
        assert!(w.iter().all(|&v| (v + mean * steps as f32).abs() < 1e-5), "sync seed {seed}: {w:?}");
    }
}

#[test]
fn the_learning_rate_schedule_spans_the_run_the_workers_announce() {
    // Cosine from 1 over a 2-step run: rate 1 at step 0, 0.5 at step 1 (½(1 + cos π/2)). A
    // schedule over "u64::MAX steps" (what an `epochs` job once gave the servers) stays at 1.
    let mut cfg = config(PsMode::Sync, 1, 0);
    cfg.optimizer.schedule.kind = tandem_api::ScheduleKind::Cosine;
    let mut net = Net::new(cfg.clone());
    net.connect(1);
    let hello = net.hello(1, TOKEN, Peer::Worker { group: 0, rank: 0, attempt: 0 }, 1, 2);
    assert!(matches!(net.call(1, hello), Frame::Welcome { .. }));
    assert!(matches!(net.call(1, Frame::Init { offset: 0, values: vec![0.0] }), Frame::Ack { .. }));
    assert!(matches!(net.call(1, Frame::Join), Frame::Joined { .. }));
    net.push(1, 0, vec![1.0]);
    assert_eq!(net.pull(1, 0, 1), Some(vec![-1.0]));
    net.push(1, 0, vec![1.0]);
    assert_eq!(net.pull(1, 0, 1), Some(vec![-1.5]), "step 1 runs at half the rate");

    // The run's length is kept in the snapshot, so a restored shard decays alike.
    let Some(snapshot) = net.shard.snapshot() else { panic!("an initialised shard has a snapshot") };
    assert_eq!(snapshot.total_steps, 2);
    let restored = ShardState::restore(cfg, snapshot).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(restored.snapshot().map(|s| s.total_steps), Some(2));
}

/// A job of `maxGroups: 4`, `groupSize: 2` and 10 steps.
fn bounded(mode: PsMode) -> ShardConfig {
    ShardConfig { bounds: JobBounds { max_groups: 4, group_size: 2, steps: Some(10) }, ..config(mode, 1, 0) }
}

fn refused_and_closed(net: &mut Net, s: SessionId, frame: Frame, code: ErrorCode, says: &[&str]) {
    let reply = net.call(s, frame);
    let Frame::Error { code: got, message } = &reply else { panic!("a refusal expected: {reply:?}") };
    assert_eq!(*got, code, "{message}");
    for part in says {
        assert!(message.contains(part), "{message:?} should say {part:?}");
    }
    assert!(net.closed.remove(&s), "the session is closed after: {message}");
}

#[test]
fn every_field_of_an_authenticated_frame_is_bounded_and_a_bad_one_closes_its_session() {
    let mut net = Net::new(bounded(PsMode::Async { staleness: Some(2) }));
    net.joined_worker(1, 0, 2, &[0.0, 0.0]);
    net.push(1, 0, vec![1.0, 1.0]);
    let before = net.shard.snapshot().unwrap();
    let hello = |net: &mut Net, s: SessionId, group: u32, rank: u32, steps: u64| {
        net.connect(s);
        net.hello(s, TOKEN, Peer::Worker { group, rank, attempt: 0 }, 2, steps)
    };
    // Group and rank indices within the plan, the run's length within any run.
    for (s, group, rank, steps, says) in [
        (10, 4, 0, STEPS, ["group 4", "workers.maxGroups is 4"]),
        (11, u32::MAX, 0, STEPS, ["group 4294967295", "workers.maxGroups is 4"]),
        (12, 1, 2, STEPS, ["rank 2 of group 1", "workers.groupSize is 2"]),
        (13, 1, 0, u64::MAX, ["18446744073709551615 steps", "beyond any run"]),
    ] {
        let frame = hello(&mut net, s, group, rank, steps);
        refused_and_closed(&mut net, s, frame, ErrorCode::OutOfBounds, &says);
    }
    assert_eq!(net.shard.status().groups.len(), 1, "no refused group is kept");

    // Steps within the run and the window; offsets within the layout; finite values. Each
    // refusal ends the session, so group 2 says hello again on a new one.
    let mut w = 20;
    let again = |net: &mut Net, w: &mut SessionId| {
        *w += 1;
        net.worker(*w, 2, 0, 1, 2);
        assert!(matches!(net.call(*w, Frame::Join), Frame::Joined { .. }));
    };
    again(&mut net, &mut w);
    let zero = Frame::Push { offset: 0, step: 0, values: vec![0.0, 0.0] };
    assert!(matches!(net.call(w, zero), Frame::Ack { .. }));
    for (step, says) in [
        (u64::MAX, &["group 2", "step 18446744073709551615", "below 10"][..]),
        (10, &["group 2", "step 10", "below 10"][..]),
        (4, &["group 2", "step 4", "steps below 1", "at most step 3"][..]),
    ] {
        let frame = Frame::Push { offset: 0, step, values: vec![1.0, 1.0] };
        refused_and_closed(&mut net, w, frame, ErrorCode::OutOfBounds, says);
        assert!(!net.shard.status().groups.iter().any(|g| g.group == 2 && g.member), "it left");
        again(&mut net, &mut w);
    }
    let frame = Frame::Push { offset: 1, step: 1, values: vec![1.0, 1.0] };
    refused_and_closed(&mut net, w, frame, ErrorCode::BadRange, &["range 1..3", "0..2"]);
    again(&mut net, &mut w);
    let frame = Frame::Push { offset: 0, step: 1, values: vec![1.0, f32::NAN] };
    refused_and_closed(&mut net, w, frame, ErrorCode::NonFinite, &["group 2", "step 1", "NaN at offset 1"]);
    again(&mut net, &mut w);
    let frame = Frame::PutState { values: vec![f32::INFINITY] };
    refused_and_closed(&mut net, w, frame, ErrorCode::NonFinite, &["group 2", "inf at index 0"]);
    let report =
        |step, samples, cursors| Frame::Report(Progress { step, samples, cursors, ..Progress::default() });
    for (frame, says) in [
        (report(11, 0, vec![]), ["step 11", "at most 10"]),
        (report(1, u64::MAX, vec![]), ["samples 18446744073709551615", "beyond any run"]),
        (report(1, 0, vec![DataCursor::at(0, 0); 3]), ["3 data cursors", "2 ranks"]),
    ] {
        again(&mut net, &mut w);
        refused_and_closed(&mut net, w, frame, ErrorCode::OutOfBounds, &says);
    }

    // Frames pipelined behind a refused one are dropped unread.
    again(&mut net, &mut w);
    let outs = net.shard.handle(w, Frame::Push { offset: 0, step: 1, values: vec![f32::NAN; 2] });
    assert!(net.shard.handle(w, Frame::Push { offset: 0, step: 1, values: vec![5.0; 2] }).is_empty());
    net.apply(outs);

    // Nothing of them reached the shard: group 0 trains on, its step applied once.
    let mut after = net.shard.snapshot().unwrap();
    assert_eq!(
        (after.version, &after.values),
        (before.version + 1, &before.values),
        "only group 2's zero push"
    );
    after.contributed.retain(|&(g, _)| g == 0);
    assert_eq!(after.contributed, before.contributed);
    assert!(net.shard.check_restorable(&net.shard.snapshot().unwrap()).is_ok());
    assert!(matches!(net.push(1, 0, vec![1.0, 1.0]), Frame::Ack { .. }));
    assert_eq!(net.pull(1, 0, 2), Some(vec![-2.0, -2.0]));
    // A valid report is taken.
    assert!(matches!(net.call(1, report(2, 64, vec![DataCursor::at(0, 2); 2])), Frame::Ack { .. }));
}

#[test]
fn a_run_in_epochs_bounds_steps_by_its_length_times_twice_the_most_groups() {
    let cfg = ShardConfig {
        bounds: JobBounds { steps: None, ..bounded(PsMode::Sync).bounds },
        ..bounded(PsMode::Sync)
    };
    let mut net = Net::new(cfg);
    net.joined_worker(1, 0, 1, &[0.0]);
    // The run's length is STEPS (the hello's), with at most 4 groups: steps below 8 × STEPS.
    assert_eq!(net.shard.step_bound(), 8 * STEPS);
    assert!(matches!(
        net.call(1, Frame::Push { offset: 0, step: 8 * STEPS - 1, values: vec![1.0] }),
        Frame::Ack { .. }
    ));
    let frame = Frame::Push { offset: 0, step: 8 * STEPS, values: vec![1.0] };
    refused_and_closed(&mut net, 1, frame, ErrorCode::OutOfBounds, &["below 8000"]);
}
