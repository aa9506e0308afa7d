//! The local runner's supervisor as a state machine: inputs in, commands out, no processes, no
//! clock.
//!
//! Expected flow: [`Supervisor::start`] returns the first spawns; the process loop in
//! [`super::run`] feeds it every [`Input`] — a progress line, an exit, the passing of time, an
//! interrupt — with the current time, and carries out the returned [`Command`]s in order until one
//! is a [`Command::Finish`]. Tests feed it the same inputs without a process.
//!
//! Guarantees:
//! - Restarts follow [`tandem_api::policy`], as the operator's do: a failure restarts its unit
//!   only (a worker group or one PS), with a raised attempt, after the back-off. A unit is judged
//!   once every one of its processes ended, or [`SETTLE`] after its first failure, so that a
//!   killed rank, not its peers' broken connections, is the cause.
//! - `tandem worker` does not reconnect to a restarted PS, so a PS restart also relaunches every
//!   unfinished group: a new attempt each, after the PS's back-off, not counted towards
//!   `maxRestarts` ([`policy::relaunch_with_ps`], as the operator relaunches the groups that
//!   lost a PS).
//! - Lines and exits of processes that were replaced are ignored; the merged progress never goes
//!   back ([`Merged`]).
//! - A parameter server that exits cleanly while groups train fails the job: nothing stops a PS
//!   but the runner.
//! - Each `--chaos` fires once, the first time the merged step reaches its step and its target
//!   runs.
//! - Stalls (`runPolicy.stallTimeoutSeconds`), as the operator declares them: while every unit
//!   runs (none failing or waiting out a back-off), a job none of whose groups reports a step
//!   past its last one for the timeout is declared stalled once per stall clock ([`Event::Stalled`]),
//!   and `stallPolicy` restarts every unfinished group (`RestartGroup`) or every unit
//!   (`RestartJob`) as one restart judged by [`tandem_api::policy`] (`maxRestarts`), or only
//!   reports it (`None`; [`Event::Unstalled`] once a step advances again). The clock starts again
//!   at every advance and while any unit restarts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tandem_api::contract::{GroupReport, Role};
use tandem_api::policy::{self, Failure, FailureKind, Relaunch, Unit, Verdict};
use tandem_api::{Backend, StallPolicy, TrainingJobSpec};

use super::Event;
use super::chaos::Chaos;
use super::progress::{Line, Merged};
use tandem_util::proc::Exit;

/// How long the other processes of a failing unit get to end on their own before the unit's
/// failure is judged.
pub const SETTLE: Duration = Duration::from_secs(3);

/// A process of the job, numbered by the supervisor in spawn order.
pub type ProcId = u64;

/// What happened.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Process `id` printed a protocol line.
    Line {
        /// The process.
        id: ProcId,
        /// The line.
        line: Line,
    },
    /// Process `id` ended.
    Exited {
        /// The process.
        id: ProcId,
        /// How.
        exit: Exit,
    },
    /// Time passed: judge settled failures, start units whose back-off ended, fire chaos.
    Tick,
    /// SIGINT or SIGTERM reached the runner.
    Interrupted,
}

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Start process `id` as `role`, attempt `attempt`.
    Spawn {
        /// The number later inputs name it by.
        id: ProcId,
        /// Its role.
        role: Role,
        /// `TANDEM_ATTEMPT`.
        attempt: u32,
    },
    /// Kill process `id` (its whole process group) and forget it: its unit restarts, and how it
    /// ends is no failure.
    Kill {
        /// The process.
        id: ProcId,
    },
    /// `--chaos`: send `signal` to process `id` (SIGKILL to an mpirun launcher reaches its
    /// ranks); its exit is then judged like any other.
    Chaos {
        /// The process.
        id: ProcId,
        /// The signal.
        signal: i32,
    },
    /// Report an event.
    Emit(Event),
    /// The job is over; nothing follows.
    Finish(Outcome),
}

/// How the job ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every group finished training.
    Trained {
        /// Most steps a rank reported (0 when none did).
        steps: u64,
        /// Rank 0's final test accuracy, if one reported it.
        accuracy: Option<f64>,
        /// Samples of every group and attempt.
        samples: u64,
        /// Restarts counted towards `maxRestarts`.
        restarts: u32,
    },
    /// The job failed; the logs of `logs` tell more.
    Failed {
        /// What failed.
        message: String,
        /// The processes whose logs to show.
        logs: Vec<ProcId>,
    },
    /// SIGINT or SIGTERM.
    Interrupted,
}

/// One process the supervisor started and has not forgotten.
#[derive(Clone, Debug)]
struct Proc {
    role: Role,
    attempt: u32,
    exit: Option<Exit>,
}

#[derive(Clone, Debug, Default)]
struct UnitState {
    attempt: u32,
    /// Since when the unit's current attempt fails, and its failed processes (earliest first).
    failing: Option<(Instant, Vec<(ProcId, Failure)>)>,
    /// When the unit starts again after a restart.
    start_at: Option<Instant>,
    /// A group whose every process finished cleanly.
    done: bool,
}

/// The state of a locally run job.
#[derive(Clone, Debug)]
pub struct Supervisor {
    spec: TrainingJobSpec,
    chaos: Vec<(Chaos, bool)>,
    restarts: u32,
    units: BTreeMap<Unit, UnitState>,
    procs: BTreeMap<ProcId, Proc>,
    next_id: ProcId,
    merged: Merged,
    steps: u64,
    accuracy: Option<f64>,
    finished: bool,
    /// The stall clock: since when no group advanced while every unit ran.
    stall_clock: Option<Instant>,
    /// A stall was declared on the current clock.
    stall_declared: bool,
    stalls: u32,
    /// Each group's last reported step in its current attempt.
    group_steps: BTreeMap<u32, u64>,
}

impl Supervisor {
    /// A supervisor of a job with `spec` (validated), killing `chaos` on the way.
    pub fn new(spec: TrainingJobSpec, chaos: Vec<Chaos>) -> Self {
        let ps = (0..spec.parameter_servers.replicas).map(Unit::Ps);
        let groups = (0..spec.workers.groups).map(Unit::Group);
        Self {
            units: ps.chain(groups).map(|unit| (unit, UnitState::default())).collect(),
            spec,
            chaos: chaos.into_iter().map(|c| (c, false)).collect(),
            restarts: 0,
            procs: BTreeMap::new(),
            next_id: 0,
            merged: Merged::default(),
            steps: 0,
            accuracy: None,
            finished: false,
            stall_clock: None,
            stall_declared: false,
            stalls: 0,
            group_steps: BTreeMap::new(),
        }
    }

    /// The first spawns: every PS by index, then every group.
    pub fn start(&mut self) -> Vec<Command> {
        let mut out = Vec::new();
        let units: Vec<Unit> = self.units.keys().copied().collect();
        for unit in units {
            self.spawn_unit(unit, &mut out);
        }
        out
    }

    /// Restarts counted towards `maxRestarts` so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Whether the job is stalled now: declared and no step advanced since.
    pub fn stalled(&self) -> bool {
        self.stall_declared
    }

    /// Stalls declared so far.
    pub fn stalls(&self) -> u32 {
        self.stalls
    }

    /// The current attempt of `unit` (0 until it restarts).
    pub fn attempt(&self, unit: Unit) -> u32 {
        self.units.get(&unit).map_or(0, |u| u.attempt)
    }

    /// Takes in `input`, observed at `now`; returns what to do, in order. After a
    /// [`Command::Finish`] it returns nothing.
    pub fn handle(&mut self, input: Input, now: Instant) -> Vec<Command> {
        if self.finished {
            return Vec::new();
        }
        let mut out = Vec::new();
        match input {
            Input::Line { id, line } => self.on_line(id, line, now, &mut out),
            Input::Exited { id, exit } => self.on_exit(id, exit, now, &mut out),
            Input::Tick => self.on_tick(now, &mut out),
            Input::Interrupted => out.push(Command::Finish(Outcome::Interrupted)),
        }
        self.finished = out.iter().any(|c| matches!(c, Command::Finish(_)));
        out
    }

    fn on_line(&mut self, id: ProcId, line: Line, now: Instant, out: &mut Vec<Command>) {
        let Some(p) = self.procs.get(&id) else { return };
        if self.attempt(Unit::of(p.role)) != p.attempt {
            return;
        }
        match line {
            Line::Progress { group, step, loss, accuracy, samples, data_wait, skipped } => {
                let report = GroupReport { step, loss, accuracy, samples, epoch: 0, data_wait, skipped };
                out.push(Command::Emit(self.merged.report(group, &report)));
                if self.group_steps.insert(group, step).is_none_or(|last| step > last) {
                    self.stall_clock = Some(now);
                    if std::mem::take(&mut self.stall_declared) {
                        out.push(Command::Emit(Event::Unstalled { step: self.merged.step() }));
                    }
                }
            }
            Line::Status { addr } if p.role == (Role::Ps { index: 0 }) => {
                out.push(Command::Emit(Event::Status { ps: 0, addr }));
            }
            Line::Status { .. } => {}
            Line::Finished { steps, accuracy, rank, .. } => {
                self.steps = self.steps.max(steps);
                if rank == 0 && accuracy.is_some() {
                    self.accuracy = accuracy;
                }
            }
        }
    }

    fn on_exit(&mut self, id: ProcId, exit: Exit, now: Instant, out: &mut Vec<Command>) {
        let Some(p) = self.procs.get_mut(&id) else { return };
        if p.exit.is_some() {
            return;
        }
        p.exit = Some(exit);
        let role = p.role;
        let unit = Unit::of(role);
        if exit.success() {
            if let Unit::Ps(_) = unit {
                let message =
                    format!("{role} stopped (exit code 0) while training ran; was it stopped from outside?");
                out.push(Command::Finish(Outcome::Failed { message, logs: vec![id] }));
            }
            return;
        }
        let failure = Failure { who: role.to_string(), role, kind: exit.failure_kind(), message: None };
        let state = self.units.entry(unit).or_default();
        state.failing.get_or_insert_with(|| (now, Vec::new())).1.push((id, failure));
    }

    fn on_tick(&mut self, now: Instant, out: &mut Vec<Command>) {
        self.fire_chaos(out);
        self.mark_done_groups();
        let failing: Vec<Unit> =
            self.units.iter().filter(|(_, s)| s.failing.is_some()).map(|(unit, _)| *unit).collect();
        for unit in failing {
            self.judge(unit, now, out);
            if out.iter().any(|c| matches!(c, Command::Finish(_))) {
                return;
            }
        }
        let due: Vec<Unit> = self
            .units
            .iter()
            .filter(|(_, s)| s.start_at.is_some_and(|at| at <= now))
            .map(|(unit, _)| *unit)
            .collect();
        for unit in due {
            if let Some(state) = self.units.get_mut(&unit) {
                state.start_at = None;
            }
            self.spawn_unit(unit, out);
        }
        if self.units.iter().filter(|(u, _)| matches!(u, Unit::Group(_))).all(|(_, s)| s.done) {
            // A user's command prints no `finished` line: its groups' reports tell.
            let (steps, accuracy) = match self.spec.workers.command {
                None => (self.steps, self.accuracy),
                Some(_) => (self.merged.step(), self.merged.groups_accuracy()),
            };
            out.push(Command::Finish(Outcome::Trained {
                steps,
                accuracy,
                samples: self.merged.samples(),
                restarts: self.restarts,
            }));
            return;
        }
        self.check_stall(now, out);
    }

    /// Declares a stall once the stall clock ran `stallTimeoutSeconds` and acts on it by
    /// `stallPolicy` (see the module's guarantees).
    fn check_stall(&mut self, now: Instant, out: &mut Vec<Command>) {
        let Some(limit) = self.spec.run_policy.stall_timeout_seconds else { return };
        if self.units.values().any(|s| s.failing.is_some() || s.start_at.is_some()) {
            self.stall_clock = Some(now);
            self.stall_declared = false;
            return;
        }
        let since = *self.stall_clock.get_or_insert(now);
        let timeout = Duration::from_secs(u64::from(limit));
        if self.stall_declared || now.duration_since(since) < timeout {
            return;
        }
        self.stall_declared = true;
        self.stalls += 1;
        let step = self.merged.step();
        let policy = self.spec.run_policy.stall_policy;
        let detail = format!(
            "no group reported a step past its last for {limit} s (runPolicy.stallTimeoutSeconds); the job's step is \
             {step}"
        );
        out.push(Command::Emit(Event::Stalled {
            step,
            seconds: limit,
            message: format!("{detail}; runPolicy.stallPolicy is {policy:?}"),
        }));
        let unfinished = |(unit, s): (&Unit, &UnitState)| (!s.done).then_some(*unit);
        let units: Vec<Unit> = match policy {
            StallPolicy::None => return,
            StallPolicy::RestartGroup => self
                .units
                .iter()
                .filter(|(u, _)| matches!(u, Unit::Group(_)))
                .filter_map(unfinished)
                .collect(),
            StallPolicy::RestartJob => self.units.iter().filter_map(unfinished).collect(),
        };
        let Some(&first) = units.first() else { return };
        let role = match first {
            Unit::Ps(index) => Role::Ps { index },
            Unit::Group(group) => Role::Worker { group, rank: 0 },
        };
        let cause =
            Failure { who: "the job".to_owned(), role, kind: FailureKind::Stalled(detail), message: None };
        match policy::judge(
            &self.spec,
            Relaunch::SameFolder,
            first,
            &cause,
            self.attempt(first),
            self.restarts,
        ) {
            Verdict::Fail { message, .. } => {
                out.push(Command::Finish(Outcome::Failed { message, logs: Vec::new() }))
            }
            Verdict::Restart { restarts, backoff, .. } => {
                self.restarts = restarts;
                let at = now + backoff;
                for unit in units {
                    self.kill_unit(unit, out);
                    let attempt = self.attempt(unit) + 1;
                    let message = format!(
                        "{cause}: restarting {unit} (runPolicy.stallPolicy {policy:?}), attempt {attempt}, restart \
                         {restarts} of {}",
                        self.spec.run_policy.max_restarts
                    );
                    self.restart(unit, attempt, at, message, out);
                }
            }
        }
    }

    /// Kills each chaos target once the merged step reached its step; a worker of an mpi group
    /// is reached through its launcher.
    fn fire_chaos(&mut self, out: &mut Vec<Command>) {
        let step = self.merged.step();
        for (c, fired) in self.chaos.iter_mut().filter(|(c, fired)| !*fired && step >= c.step) {
            let target = match (c.target, self.spec.workers.backend) {
                (Role::Worker { group, .. }, Backend::Mpi) => Role::Launcher { group },
                (t, _) => t,
            };
            let live = self.procs.iter().find(|(_, p)| p.role == target && p.exit.is_none());
            if let Some((&id, _)) = live {
                *fired = true;
                out.push(Command::Chaos { id, signal: c.action.signal() });
                out.push(Command::Emit(Event::Chaos {
                    target: c.target.to_string(),
                    step,
                    action: c.action.name(),
                }));
            }
        }
    }

    /// Groups whose every process of the current attempt finished cleanly are done.
    fn mark_done_groups(&mut self) {
        for (unit, state) in self.units.iter_mut() {
            if !matches!(unit, Unit::Group(_))
                || state.done
                || state.failing.is_some()
                || state.start_at.is_some()
            {
                continue;
            }
            let mut mine = self.procs.values().filter(|p| Unit::of(p.role) == *unit).peekable();
            if mine.peek().is_some() && mine.all(|p| p.exit.is_some_and(Exit::success)) {
                state.done = true;
            }
        }
    }

    /// Decides about a failing unit once its processes ended or [`SETTLE`] passed.
    fn judge(&mut self, unit: Unit, now: Instant, out: &mut Vec<Command>) {
        let Some(state) = self.units.get(&unit) else { return };
        let Some((since, _)) = &state.failing else { return };
        let all_ended = self.procs.values().filter(|p| Unit::of(p.role) == unit).all(|p| p.exit.is_some());
        if !all_ended && now.duration_since(*since) < SETTLE {
            return;
        }
        let Some((_, failed)) = self.units.get_mut(&unit).and_then(|s| s.failing.take()) else { return };
        self.kill_unit(unit, out);
        let (logs, failures): (Vec<ProcId>, Vec<Failure>) = failed.into_iter().unzip();
        let Some(cause) = policy::cause(&self.spec.run_policy, &failures) else { return };
        match policy::judge(&self.spec, Relaunch::SameFolder, unit, cause, self.attempt(unit), self.restarts)
        {
            Verdict::Fail { message, .. } => out.push(Command::Finish(Outcome::Failed { message, logs })),
            Verdict::Restart { attempt, restarts, backoff, message } => {
                self.restarts = restarts;
                let at = now + backoff;
                self.restart(unit, attempt, at, message, out);
                if let Unit::Ps(ps) = unit {
                    self.relaunch_groups_for(ps, at, out);
                }
            }
        }
    }

    /// The workers lose parameter server `ps`: every unfinished group starts again with it, as a
    /// new attempt that does not count as a restart.
    fn relaunch_groups_for(&mut self, ps: u32, at: Instant, out: &mut Vec<Command>) {
        let groups: Vec<Unit> = self
            .units
            .iter()
            .filter(|(unit, s)| matches!(unit, Unit::Group(_)) && !s.done)
            .map(|(unit, _)| *unit)
            .collect();
        for group in groups {
            self.kill_unit(group, out);
            let verdict =
                policy::relaunch_with_ps(group, ps, self.attempt(group), self.restarts, Duration::ZERO);
            if let Verdict::Restart { attempt, message, .. } = verdict {
                self.restart(group, attempt, at, message, out);
            }
        }
    }

    /// Records that `unit` starts again as `attempt` at `at`, and says so.
    fn restart(&mut self, unit: Unit, attempt: u32, at: Instant, message: String, out: &mut Vec<Command>) {
        if let Some(state) = self.units.get_mut(&unit) {
            state.attempt = attempt;
            state.failing = None;
            state.start_at = Some(at);
        }
        let (role, index) = match unit {
            Unit::Ps(index) => ("ps", index),
            Unit::Group(group) => {
                self.merged.restart(group);
                self.group_steps.remove(&group);
                ("group", group)
            }
        };
        out.push(Command::Emit(Event::Restart { role, index, attempt, message }));
    }

    /// Kills and forgets every process of `unit`.
    fn kill_unit(&mut self, unit: Unit, out: &mut Vec<Command>) {
        let ids: Vec<ProcId> =
            self.procs.iter().filter(|(_, p)| Unit::of(p.role) == unit).map(|(&id, _)| id).collect();
        for id in ids {
            self.procs.remove(&id);
            out.push(Command::Kill { id });
        }
    }

    /// Spawns the processes of `unit` at its current attempt: a PS; a group's ranks, or with
    /// `backend: mpi` its launcher (which starts the ranks under mpirun).
    fn spawn_unit(&mut self, unit: Unit, out: &mut Vec<Command>) {
        let attempt = self.attempt(unit);
        let roles: Vec<Role> = match unit {
            Unit::Ps(index) => vec![Role::Ps { index }],
            Unit::Group(group) if self.spec.workers.backend == Backend::Mpi => vec![Role::Launcher { group }],
            Unit::Group(group) => {
                (0..self.spec.workers.group_size).map(|rank| Role::Worker { group, rank }).collect()
            }
        };
        for role in roles {
            let id = self.next_id;
            self.next_id += 1;
            self.procs.insert(id, Proc { role, attempt, exit: None });
            out.push(Command::Spawn { id, role, attempt });
        }
    }
}

#[cfg(test)]
mod tests;
