//! The supervisor without processes: inputs in, commands checked.

use super::*;

/// Two PS and two groups of two ranks, hybrid, 1 s back-off, three restarts.
fn spec(edit: impl FnOnce(&mut TrainingJobSpec)) -> TrainingJobSpec {
    let mut spec: TrainingJobSpec = serde_yaml::from_str(
        "model: {kind: mlp, hidden: [8]}\ndata: {source: mnist5k}\ntraining: {algorithm: hybrid, steps: 10}\n\
         parameterServers: {replicas: 2}\nworkers: {groups: 2, groupSize: 2}\n\
         runPolicy: {backoffSeconds: 1, maxRestarts: 3}\n",
    )
    .expect("spec parses");
    edit(&mut spec);
    spec
}

/// What the run policy says about `who` (in `role`) failing as `kind` in its unit's attempt
/// `attempt`, when the job used `restarts`: the supervisor must act on and report exactly this.
fn verdict(
    spec: &TrainingJobSpec,
    who: &str,
    role: Role,
    kind: policy::FailureKind,
    attempt: u32,
    restarts: u32,
) -> Verdict {
    let failure = Failure { who: who.to_owned(), role, kind, message: None };
    policy::judge(spec, Relaunch::SameFolder, Unit::of(role), &failure, attempt, restarts)
}

/// Ids of the hybrid job's first processes.
const PS0: ProcId = 0;
const PS1: ProcId = 1;
const G0R0: ProcId = 2;
const G0R1: ProcId = 3;
const G1R0: ProcId = 4;
const G1R1: ProcId = 5;

struct Run {
    sup: Supervisor,
    t0: Instant,
}

impl Run {
    fn new(spec: TrainingJobSpec, chaos: &[&str]) -> (Self, Vec<Command>) {
        let chaos = chaos.iter().map(|c| c.parse().expect("chaos parses")).collect();
        let mut sup = Supervisor::new(spec, chaos);
        let first = sup.start();
        (Self { sup, t0: Instant::now() }, first)
    }

    fn at(&self, seconds: f64) -> Instant {
        self.t0 + Duration::from_secs_f64(seconds)
    }

    fn exit(&mut self, id: ProcId, exit: Exit, seconds: f64) -> Vec<Command> {
        let now = self.at(seconds);
        self.sup.handle(Input::Exited { id, exit }, now)
    }

    fn tick(&mut self, seconds: f64) -> Vec<Command> {
        let now = self.at(seconds);
        self.sup.handle(Input::Tick, now)
    }

    fn line(&mut self, id: ProcId, line: Line) -> Vec<Command> {
        self.line_at(id, line, 0.0)
    }

    fn line_at(&mut self, id: ProcId, line: Line, seconds: f64) -> Vec<Command> {
        let now = self.at(seconds);
        self.sup.handle(Input::Line { id, line }, now)
    }
}

fn progress(group: u32, step: u64, samples: u64) -> Line {
    Line::Progress { group, step, loss: Some(0.5), accuracy: None, samples, data_wait: 0.25, skipped: 1 }
}

fn spawns(commands: &[Command]) -> Vec<(ProcId, Role, u32)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Spawn { id, role, attempt } => Some((*id, *role, *attempt)),
            _ => None,
        })
        .collect()
}

fn kills(commands: &[Command]) -> Vec<ProcId> {
    commands.iter().filter_map(|c| if let Command::Kill { id } = c { Some(*id) } else { None }).collect()
}

fn restarts(commands: &[Command]) -> Vec<(&'static str, u32, u32, String)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Emit(Event::Restart { role, index, attempt, message }) => {
                Some((*role, *index, *attempt, message.clone()))
            }
            _ => None,
        })
        .collect()
}

fn outcome(commands: &[Command]) -> Option<&Outcome> {
    commands.iter().find_map(|c| if let Command::Finish(o) = c { Some(o) } else { None })
}

fn worker(group: u32, rank: u32) -> Role {
    Role::Worker { group, rank }
}

#[test]
fn the_job_starts_every_ps_then_every_rank_at_attempt_zero() {
    let (_, first) = Run::new(spec(|_| {}), &[]);
    let expected = [
        (PS0, Role::Ps { index: 0 }, 0),
        (PS1, Role::Ps { index: 1 }, 0),
        (G0R0, worker(0, 0), 0),
        (G0R1, worker(0, 1), 0),
        (G1R0, worker(1, 0), 0),
        (G1R1, worker(1, 1), 0),
    ];
    assert_eq!(spawns(&first), expected);
    assert_eq!(first.len(), 6, "nothing but spawns");

    let (_, first) = Run::new(spec(|s| s.workers.backend = Backend::Mpi), &[]);
    let roles: Vec<Role> = spawns(&first).into_iter().map(|(_, role, _)| role).collect();
    assert_eq!(
        roles,
        [
            Role::Ps { index: 0 },
            Role::Ps { index: 1 },
            Role::Launcher { group: 0 },
            Role::Launcher { group: 1 }
        ],
        "an mpi group is its launcher"
    );
}

#[test]
fn a_killed_rank_restarts_its_group_only_once_its_peer_ended_and_after_the_back_off() {
    let (mut run, _) = Run::new(spec(|_| {}), &[]);
    assert!(run.exit(G0R1, Exit::Signal(9), 0.0).is_empty());
    assert!(run.tick(1.0).is_empty(), "its peer still runs and the settle time has not passed");
    run.exit(G0R0, Exit::Code(200), 1.5);
    let judged = run.tick(1.5);
    assert_eq!(kills(&judged), [G0R0, G0R1], "the group's processes go, the other group's stay");
    let restarted = restarts(&judged);
    assert_eq!(restarted.len(), 1);
    let (role, index, attempt, message) = &restarted[0];
    assert_eq!((*role, *index, *attempt), ("group", 0, 1));
    // The killed rank is the cause, as the policy picks it, and its verdict is what the user reads.
    let Verdict::Restart { message: said, .. } =
        verdict(&run.sup.spec, "worker 0/1", worker(0, 1), policy::FailureKind::Signal(9), 0, 0)
    else {
        panic!("a signal restarts")
    };
    assert_eq!(message, &said);
    assert!(spawns(&judged).is_empty(), "not before the back-off");
    assert_eq!(run.sup.restarts(), 1);
    assert_eq!(run.sup.attempt(Unit::Group(0)), 1);
    assert_eq!(run.sup.attempt(Unit::Group(1)), 0);

    assert!(run.tick(2.0).is_empty(), "back-off of 1 s from 1.5 s");
    let back = run.tick(2.5);
    assert_eq!(spawns(&back), [(6, worker(0, 0), 1), (7, worker(0, 1), 1)]);
}

#[test]
fn a_failing_unit_is_judged_after_the_settle_time_even_if_a_peer_hangs() {
    let (mut run, _) = Run::new(spec(|_| {}), &[]);
    run.exit(G1R0, Exit::Signal(9), 10.0);
    assert!(run.tick(12.9).is_empty());
    let judged = run.tick(13.0);
    assert_eq!(kills(&judged), [G1R0, G1R1]);
    assert_eq!(restarts(&judged)[0].1, 1);
}

#[test]
fn a_ps_restart_relaunches_every_unfinished_group_without_counting_it() {
    let (mut run, _) = Run::new(spec(|_| {}), &[]);
    run.exit(G1R0, Exit::Code(0), 0.0);
    run.exit(G1R1, Exit::Code(0), 0.0);
    assert!(run.tick(0.0).is_empty(), "group 1 is done; the job waits for group 0");
    run.exit(PS1, Exit::Signal(9), 1.0);
    let judged = run.tick(1.0);
    assert_eq!(kills(&judged), [PS1, G0R0, G0R1], "group 1 finished and is left alone");
    let restarted = restarts(&judged);
    assert_eq!(restarted.len(), 2);
    assert_eq!((restarted[0].0, restarted[0].1, restarted[0].2), ("ps", 1, 1));
    let Verdict::Restart { message, .. } =
        verdict(&run.sup.spec, "ps 1", Role::Ps { index: 1 }, policy::FailureKind::Signal(9), 0, 0)
    else {
        panic!("a signal restarts")
    };
    assert_eq!(restarted[0].3, message, "locally the PS keeps its folder: the policy's SameFolder message");
    assert_eq!(
        restarted[1],
        (
            "group",
            0,
            1,
            "group 0 relaunched because parameter server 1 restarted (not counted towards runPolicy.maxRestarts: \
             the server's restart was)"
                .to_owned()
        )
    );
    assert_eq!(run.sup.restarts(), 1, "the relaunch is not a restart");

    let back = run.tick(2.0);
    assert_eq!(spawns(&back), [(6, Role::Ps { index: 1 }, 1), (7, worker(0, 0), 1), (8, worker(0, 1), 1)]);
}

#[test]
fn a_permanent_exit_fails_the_job_naming_the_process_and_its_log() {
    let (mut run, _) = Run::new(spec(|_| {}), &[]);
    run.exit(G1R0, Exit::Code(2), 0.0);
    let judged = run.tick(3.0);
    assert_eq!(kills(&judged), [G1R0, G1R1]);
    let Some(Outcome::Failed { message, logs }) = outcome(&judged) else { panic!("fails: {judged:?}") };
    assert!(message.starts_with("worker 1/0 exited with code 2 (permanent: "), "{message}");
    assert_eq!(logs, &[G1R0]);
    assert!(run.tick(4.0).is_empty(), "nothing after the end");
    assert!(run.exit(PS0, Exit::Code(0), 4.0).is_empty());
}

#[test]
fn past_max_restarts_the_job_fails() {
    let (mut run, _) = Run::new(spec(|s| s.run_policy.max_restarts = 1), &[]);
    run.exit(G0R0, Exit::Signal(9), 0.0);
    run.exit(G0R1, Exit::Code(200), 0.0);
    assert_eq!(restarts(&run.tick(0.0)).len(), 1);
    run.exit(PS0, Exit::Signal(15), 0.5);
    let judged = run.tick(0.5);
    let Some(Outcome::Failed { message, logs }) = outcome(&judged) else { panic!("fails: {judged:?}") };
    let Verdict::Fail { message: said, .. } =
        verdict(&run.sup.spec, "ps 0", Role::Ps { index: 0 }, policy::FailureKind::Signal(15), 0, 1)
    else {
        panic!("past maxRestarts")
    };
    assert_eq!(message, &said);
    assert_eq!(logs, &[PS0]);
}

#[test]
fn a_ps_that_exits_cleanly_while_groups_train_fails_the_job() {
    let (mut run, _) = Run::new(spec(|_| {}), &[]);
    let done = run.exit(PS1, Exit::Code(0), 0.0);
    let Some(Outcome::Failed { message, logs }) = outcome(&done) else { panic!("fails: {done:?}") };
    assert!(message.contains("ps 1 stopped (exit code 0) while training ran"), "{message}");
    assert_eq!(logs, &[PS1]);
}

#[test]
fn progress_is_merged_and_lines_of_replaced_processes_are_ignored() {
    let (mut run, _) = Run::new(spec(|_| {}), &[]);
    let out = run.line(G0R0, progress(0, 100, 6400));
    let expected = Event::Progress {
        step: 100,
        group: 0,
        group_step: 100,
        loss: Some(0.5),
        group_loss: Some(0.5),
        accuracy: None,
        samples: 6400,
        data_wait: 0.25,
        skipped: 1,
    };
    assert_eq!(out, [Command::Emit(expected)]);
    run.exit(G0R0, Exit::Signal(9), 0.0);
    run.exit(G0R1, Exit::Code(200), 0.0);
    run.tick(0.0);
    assert!(run.line(G0R0, progress(0, 150, 9600)).is_empty(), "the old rank 0 is gone");
    run.tick(1.0);
    let out = run.line(6, progress(0, 20, 1280));
    let Some(Command::Emit(Event::Progress { step, group_step, samples, .. })) = out.first() else {
        panic!("{out:?}")
    };
    assert_eq!((*step, *group_step, *samples), (100, 20, 6400 + 1280), "the merged step stays at the front");

    // Only parameter server 0 announces the status endpoint.
    let status = |addr: &str| Line::Status { addr: addr.to_owned() };
    assert_eq!(
        run.line(PS0, status("127.0.0.1:9")),
        [Command::Emit(Event::Status { ps: 0, addr: "127.0.0.1:9".into() })]
    );
    assert!(run.line(PS1, status("127.0.0.1:8")).is_empty());
}

#[test]
fn chaos_kills_its_target_once_when_the_merged_step_reaches_it() {
    let (mut run, _) = Run::new(spec(|_| {}), &["kill:worker:0:1@100"]);
    run.line(G1R0, progress(1, 99, 1));
    assert!(run.tick(0.0).is_empty());
    run.line(G1R0, progress(1, 100, 2));
    let fired = run.tick(0.1);
    assert_eq!(
        fired,
        [
            Command::Chaos { id: G0R1, signal: libc::SIGKILL },
            Command::Emit(Event::Chaos { target: "worker 0/1".to_owned(), step: 100, action: "kill" })
        ]
    );
    assert!(run.tick(0.2).is_empty(), "once");
    // Its death is a failure like any other: the group restarts.
    run.exit(G0R1, Exit::Signal(9), 0.3);
    run.exit(G0R0, Exit::Code(200), 0.3);
    assert_eq!(restarts(&run.tick(0.3)).len(), 1);

    // With mpi a worker is reached through its group's launcher.
    let (mut run, _) = Run::new(spec(|s| s.workers.backend = Backend::Mpi), &["kill:worker:1:0@0"]);
    assert_eq!(run.tick(0.0)[0], Command::Chaos { id: 3, signal: libc::SIGKILL });
}

#[test]
fn the_job_is_trained_when_every_group_finished() {
    let (mut run, _) = Run::new(spec(|_| {}), &[]);
    run.line(G0R0, progress(0, 10, 640));
    for (id, group, rank, accuracy) in
        [(G0R0, 0, 0, 0.93), (G0R1, 0, 1, 0.5), (G1R0, 1, 0, 0.91), (G1R1, 1, 1, 0.4)]
    {
        run.line(id, Line::Finished { group, rank, steps: 10, accuracy: Some(accuracy) });
    }
    for id in [G0R0, G0R1, G1R0] {
        run.exit(id, Exit::Code(0), 1.0);
    }
    assert!(outcome(&run.tick(1.0)).is_none(), "group 1 has a rank left");
    run.exit(G1R1, Exit::Code(0), 2.0);
    let done = run.tick(2.0);
    assert_eq!(
        outcome(&done),
        Some(&Outcome::Trained { steps: 10, accuracy: Some(0.91), samples: 640, restarts: 0 }),
        "the last rank 0 to report gives the accuracy"
    );
}

#[test]
fn an_interrupt_ends_the_job() {
    let (mut run, _) = Run::new(spec(|_| {}), &[]);
    let now = run.t0;
    assert_eq!(run.sup.handle(Input::Interrupted, now), [Command::Finish(Outcome::Interrupted)]);
    assert!(run.tick(1.0).is_empty());
}

fn stalled(commands: &[Command]) -> Option<String> {
    commands.iter().find_map(|c| match c {
        Command::Emit(Event::Stalled { message, .. }) => Some(message.clone()),
        _ => None,
    })
}

fn stalling(policy: tandem_api::StallPolicy) -> TrainingJobSpec {
    spec(|s| {
        s.run_policy.stall_timeout_seconds = Some(30);
        s.run_policy.stall_policy = policy;
    })
}

#[test]
fn a_step_that_stays_put_is_reported_once_as_stalled_and_cleared_when_it_advances() {
    let (mut run, _) = Run::new(stalling(tandem_api::StallPolicy::None), &[]);
    run.tick(0.0);
    run.line_at(G0R0, progress(0, 10, 320), 5.0);
    assert!(stalled(&run.tick(34.0)).is_none(), "30 s from the last advance, not from the start");
    let out = run.tick(36.0);
    let message = stalled(&out).expect("stalled after 30 s without a step");
    assert!(
        message.contains("for 30 s") && message.contains("step is 10") && message.contains("None"),
        "{message}"
    );
    assert!(kills(&out).is_empty() && restarts(&out).is_empty(), "stallPolicy None only reports: {out:?}");
    assert!(run.sup.stalled() && run.sup.stalls() == 1);
    assert!(stalled(&run.tick(50.0)).is_none(), "declared once");
    // The same step again is no advance; another group's first step is.
    assert!(
        run.line_at(G0R0, progress(0, 10, 320), 51.0)
            .iter()
            .all(|c| !matches!(c, Command::Emit(Event::Unstalled { .. })))
    );
    let out = run.line_at(G1R0, progress(1, 10, 320), 52.0);
    assert!(out.contains(&Command::Emit(Event::Unstalled { step: 10 })), "{out:?}");
    assert!(!run.sup.stalled());
    assert!(stalled(&run.tick(81.0)).is_none());
    assert!(stalled(&run.tick(83.0)).is_some(), "a new clock from the advance at 52 s");
    assert_eq!((run.sup.stalls(), run.sup.restarts()), (2, 0));
}

#[test]
fn a_stall_with_restart_group_restarts_every_group_as_one_restart_and_keeps_the_ps() {
    let spec = stalling(tandem_api::StallPolicy::RestartGroup);
    let (mut run, _) = Run::new(spec.clone(), &[]);
    run.tick(0.0);
    let out = run.tick(31.0);
    assert!(stalled(&out).is_some());
    let mut killed = kills(&out);
    killed.sort();
    assert_eq!(killed, [G0R0, G0R1, G1R0, G1R1], "every group's ranks, not the PS");
    let restarted: Vec<(&str, u32, u32)> = restarts(&out).into_iter().map(|(r, i, a, _)| (r, i, a)).collect();
    assert_eq!(restarted, [("group", 0, 1), ("group", 1, 1)]);
    assert!(
        restarts(&out)[0].3.contains("the job stalled") && restarts(&out)[0].3.contains("restart 1 of 3")
    );
    assert_eq!(run.sup.restarts(), 1, "one stall is one restart of the job");
    assert!(spawns(&run.tick(31.5)).is_empty(), "after the back-off");
    let back = run.tick(32.0);
    assert_eq!(spawns(&back).len(), 4);
    assert!(spawns(&back).iter().all(|(_, _, attempt)| *attempt == 1));
    assert!(stalled(&run.tick(61.0)).is_none(), "the clock started again while the groups restarted");
    assert!(stalled(&run.tick(62.0)).is_some());
    assert_eq!(run.sup.restarts(), 2);
}

#[test]
fn a_stall_with_restart_job_past_max_restarts_fails_the_job() {
    let mut spec = stalling(tandem_api::StallPolicy::RestartJob);
    spec.run_policy.max_restarts = 0;
    let (mut run, _) = Run::new(spec, &[]);
    run.tick(0.0);
    let out = run.tick(31.0);
    match outcome(&out) {
        Some(Outcome::Failed { message, .. }) => {
            assert!(message.contains("stalled") && message.contains("maxRestarts"), "{message}")
        }
        other => panic!("the job fails: {other:?}"),
    }
}
