//! A model of the idempotency protocol, checked exhaustively within bounds by
//! [`stateright`].
//!
//! One key, one store, two engines (each with its own replay cache and heartbeat) and
//! their clients' requests, on a network that delays any call or its answer and loses
//! any call past the caller's timeout while the call may still take effect later. Time
//! runs in ticks (one tick is one second of the engines' and the store's clocks); every
//! step may happen at any tick, so an overloaded runtime, a slow store and a slow network
//! are all in the explored interleavings. Engines crash, the operator forgets the key,
//! and an in-process store's wall clock steps.
//!
//! The model decides as the code does by calling the same functions
//! ([`idempotent_runtime::testing::protocol`]), on its record as the fenced record seam
//! keeps it ([`SeamRecord`]): the store's claim classifies a found record with
//! [`rules::claim`] (the takeover rule), ownership is [`rules::owned_by`], a renewal is
//! [`Change::Renew`] as [`SeamRecord::changed`] applies it, the engine runs a claim, raises
//! `lease_lost` and times its renewals by [`licence_holds`] and [`renewal_timeout`], and
//! gives up recording an answer by [`may_stop_recording`]. What it adds is the
//! sequencing around them, written after the runtime's `engine/protocol.rs` (claim and
//! run), `engine/heartbeat.rs`, `engine/record.rs` (completion retries) and `fenced/`
//! (each store operation as the protocol runs it over the seam).
//!
//! Recovery points: a handler runs [`Protocol::steps`] named steps in order. It skips a
//! step whose output came back in its claim's answer; otherwise it checks its licence as
//! the engine does before a step, does the step's side effect and sends `record_step`,
//! and stops when the store answers that its token owns nothing (or the call times out:
//! the handler fails, and the engine releases). A crash or a lost call between a side
//! effect and its record leaves that step to run again (steps are at least once). The
//! store appends a step only under the holder's token, a takeover keeps or clears them
//! by [`steps_survive`], `complete` clears them, and `release` keeps a record that holds
//! steps, its lease ended and its token [`RELEASED`], by [`rules::release`]. A
//! handler may also return a 5xx between two steps, which the engine releases, so that
//! the release that keeps a record is explored.
//!
//! At-most-once steps ([`Protocol::at_most_once`]): before the side effect the engine
//! records the step's intent (`record_step` of an empty output, fenced like any step),
//! and does the effect only once the store said it holds it. An execution that finds the
//! intent without the output does not repeat the effect: it asks `verify`, which here
//! knows whether the effect happened in the record's lifetime (the provider's view),
//! and records the output it found, or, when nothing happened, goes on to the effect.
//!
//! The invariants ([`Protocol::properties`]; a violation of a history-dependent one is
//! noted in [`History::violations`] at the step that breaks it):
//!
//! 1. at most one side effect of each step per record lifetime (between TTL expiry or
//!    `forget`), except a retry's after a takeover of a lost lease (the owner crashed, or
//!    none of its renewals reached the store for a lease) or after a release that deleted
//!    the record, and none once a response was recorded (a handler without steps counts
//!    as one step);
//! 2. a side effect happens only while its claim's token holds a live lease in the
//!    store, and the store hands a key to another claim only once its holder's licence
//!    ended;
//! 3. a replay is the key's record, or a copy of one forgotten within the replay cache's
//!    maximum age;
//! 4. an engine stops trying to record a finished handler's answer only once its lease
//!    is lost or the record's TTL ended;
//! 5. a live lease ends within one lease, by the store's lease clock, whatever the wall
//!    clock did;
//! 6. at most one recorded output per step per record lifetime: the store never appends a
//!    step the record already holds;
//! 7. a resumed execution never reruns a recorded step: no step's side effect happens
//!    while the record of its lifetime holds that step's output.
//! 8. a record holding steps lives at least a TTL past its owner's last claim or renewal
//!    (a renewal keeps the record a TTL past it), so a handler that outlived its TTL and
//!    crashed is resumed by the retry of its request, not run again from the start.
//! 9. an at-most-once step's side effect happens at most once per record lifetime,
//!    through crashes, lost calls and takeovers between its intent, its effect and its
//!    output.
//!
//! [`Rules`] turns each fix of the protocol review, and each rule of recovery points, off
//! to show that the checker finds the interleaving it closed (`tests/check.rs`). Larger
//! bounds than CI's run from `src/main.rs`.
//!
//! Not modelled: the store's internal queues (a store that drops a renewal that reached
//! it is, to the model, a lost renewal, which the contract treats like a crashed owner),
//! a store clock running at another rate than the engines' (the licence's margin is for
//! that), transactional handlers (their side effect commits with the completion; so do
//! their steps), duplicates that wait instead of answering `409`, step names and outputs
//! (a step is its index: the engine never records a name twice, and its output's bytes
//! do not change the protocol), a `record_step` the engine retries (one past the store
//! timeout fails the handler), and steps in the checks about anything else: CI checks
//! them in bounds of their own, since they multiply the state space.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use idempotent_runtime::Fingerprint;
use idempotent_runtime::store::{
    Change, FencingToken, Record as SeamRecord, RecordBody, StoreNow, StoredResponse, Takeover,
};
use idempotent_runtime::testing::protocol::rules::{self, Release};
use idempotent_runtime::testing::protocol::{
    Decision, licence_holds, may_stop_recording, renewal_timeout, steps_survive,
};
use stateright::{Model, Property};

/// A point in time, in ticks (seconds).
pub type Tick = i16;

/// The two engines.
pub const ENGINES: usize = 2;

/// Calls given up by their caller that may still reach the store; one more is lost.
const ORPHANS: usize = 1;

/// The token of a record that a release kept (`FencingToken::RELEASED`): no claim's.
pub const RELEASED: u8 = u8::MAX;

/// The named steps a handler runs, in order, in CI's bounds.
pub const STEPS: u8 = 2;

/// The bit of `step` in a set of steps.
fn bit(step: u8) -> u8 {
    1 << step
}

/// Where the store keeps time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// A database server (Postgres, MySQL, Redis): one clock, never stepped here.
    Server,
    /// The memory or SQLite store: TTLs on the host's wall clock, which steps.
    InProcess,
}

/// The fixes of the protocol review; each can be turned off to see the checker find
/// what it closed.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// A claim answered after its licence ended is released, not run (interleaving 1).
    pub late_claim_check: bool,
    /// An in-process store judges leases on a clock that a wall step cannot move
    /// (interleaving 3).
    pub leases_on_monotonic: bool,
    /// An engine that holds the lease keeps trying to record its answer past the retry
    /// window (the completion case).
    pub record_while_held: bool,
    /// A replay cache entry's maximum age counts from when the call that read the record
    /// was sent, not from when its answer arrived (found by this model).
    pub cache_age_from_read: bool,
    /// A takeover of a lost lease keeps the record's steps and returns them
    /// ([`steps_survive`]); off, every takeover drops them.
    pub steps_survive_lease_loss: bool,
    /// `record_step` appends only while the record is in progress under the caller's
    /// token; off, it appends to whatever claim holds the record.
    pub record_step_fenced: bool,
    /// A renewal keeps the record a whole TTL past it; off, only to the end of the
    /// renewed lease, so a handler that outlived its TTL and crashed leaves a record that
    /// expires with its lease, steps and all (issue 44, item 1).
    pub renewal_keeps_a_ttl: bool,
    /// An at-most-once step records its intent before its side effect; off, it goes
    /// straight to the effect, as an at-least-once step does.
    pub intent_before_call: bool,
}

impl Rules {
    /// The protocol as the code runs it.
    pub const FIXED: Self = Self {
        late_claim_check: true,
        leases_on_monotonic: true,
        record_while_held: true,
        cache_age_from_read: true,
        steps_survive_lease_loss: true,
        record_step_fenced: true,
        renewal_keeps_a_ttl: true,
        intent_before_call: true,
    };
}

/// The model's bounds and the protocol's settings.
#[derive(Debug, Clone)]
pub struct Protocol {
    /// The lease, in ticks.
    pub lease: Tick,
    /// The TTL, in ticks.
    pub ttl: Tick,
    /// The engine's store timeout, in ticks.
    pub store_timeout: Tick,
    /// The engine's completion retry window, in ticks.
    pub retry_window: Tick,
    /// The replay cache's maximum age, in ticks.
    pub cache_max_age: Tick,
    /// Where the store keeps time.
    pub store: StoreKind,
    /// The fingerprints of the requests each engine's clients send, in order (all with
    /// the same key and scope): `0` is the original request, `1` another request reusing
    /// its key.
    pub requests: [&'static [u8]; ENGINES],
    /// How many engine crashes may happen.
    pub crashes: u8,
    /// How many times the operator may forget the key.
    pub forgets: u8,
    /// The steps the in-process store's wall clock may take (at most one of them).
    pub wall_steps: &'static [Tick],
    /// The named steps each handler runs, in order (up to 8): each is a side effect whose
    /// output the engine records with the record. `0`: the handler's one side effect is
    /// not a step (nothing is recorded before the completion), which keeps the checks
    /// that are not about steps as small as before steps existed.
    pub steps: u8,
    /// A handler may return a 5xx between two of its steps (the engine releases it),
    /// besides when it sees `lease_lost()`.
    pub fail_between_steps: bool,
    /// The steps that are at most once (a set of step bits): intent, effect, output.
    pub at_most_once: u8,
    /// The fixes in force.
    pub rules: Rules,
}

impl Protocol {
    /// The bounds CI checks: a lease of 3 ticks under a store timeout of 4 (the
    /// configuration in which a claim can be answered after its lease ran out), a TTL of
    /// 6, three requests, one crash and one forget, and for an in-process store one
    /// wall-clock step forward or back by more than a lease; handlers of [`STEPS`] steps
    /// that may return a 5xx between them. Time runs on without end.
    pub fn ci(store: StoreKind) -> Self {
        Self {
            lease: 3,
            ttl: 6,
            store_timeout: 4,
            retry_window: 2,
            cache_max_age: 2,
            store,
            requests: [&[0], &[0, 0]],
            crashes: 1,
            forgets: 1,
            wall_steps: match store {
                StoreKind::Server => &[],
                StoreKind::InProcess => &[4, -4],
            },
            steps: STEPS,
            fail_between_steps: true,
            at_most_once: 0,
            rules: Rules::FIXED,
        }
    }

    /// The side effects a handler does: its steps, or its one side effect without them.
    fn effects(&self) -> u8 {
        self.steps.max(1)
    }

    fn duration(ticks: Tick) -> Duration {
        Duration::from_secs(u64::try_from(ticks.max(0)).unwrap_or(0))
    }

    /// The licence rule, in ticks: a lease granted by a call sent `age` ago.
    fn licence_holds(&self, age: Tick) -> bool {
        licence_holds(Self::duration(age), Self::duration(self.lease))
    }

    /// The renewal's timeout in whole ticks (rounded up: the engine waits at least that).
    fn renewal_timeout(&self) -> Tick {
        let timeout = renewal_timeout(
            Self::duration(self.store_timeout),
            Self::duration(self.lease),
        );
        Tick::try_from(timeout.as_millis().div_ceil(1000)).unwrap_or(Tick::MAX)
    }
}

/// The one record of the key in the store. Times are what is left of them, by the
/// store's clocks; zero is run out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    /// The fingerprint of the request that claimed it.
    pub fingerprint: u8,
    /// The fencing token of the claim that holds it ([`RELEASED`] once a release kept it).
    pub token: u8,
    /// The recorded response (named by the token of the run that produced it); `None`:
    /// in progress.
    pub response: Option<u8>,
    /// The lease left, on the store's lease clock.
    pub lease_left: Tick,
    /// The TTL left, on the store's wall clock.
    pub ttl_left: Tick,
    /// The steps recorded under it (a set of step bits), in progress only.
    pub steps: u8,
    /// The at-most-once steps whose intent is recorded under it (a set), in progress
    /// only.
    pub intents: u8,
}

/// The instant the model's records are seen at by the engine's rules: zero on both of the
/// store's clocks, so that a time left is the time at which it runs out.
const SEAM_NOW: StoreNow = StoreNow {
    wall_millis: 0,
    lease_millis: 0,
};

/// A model token as the store keeps it: [`RELEASED`] is [`FencingToken::RELEASED`], and
/// no claim's token is.
fn seam_token(token: u8) -> FencingToken {
    if token == RELEASED {
        FencingToken::RELEASED
    } else {
        FencingToken(i64::from(token) + 1)
    }
}

/// A model fingerprint as the store keeps it.
fn seam_fingerprint(fingerprint: u8) -> Fingerprint {
    Fingerprint {
        version: 1,
        digest: [fingerprint; 32],
    }
}

/// Milliseconds at [`SEAM_NOW`] as whole ticks left.
fn ticks(millis: i64) -> Tick {
    Tick::try_from(millis.div_euclid(1000)).unwrap_or(Tick::MAX)
}

impl Record {
    /// This record as the fenced record seam keeps it, seen at [`SEAM_NOW`]: what the
    /// engine's rules (the same functions `Fenced` decides with) take.
    fn seam(&self) -> SeamRecord {
        let millis = |left: Tick| i64::from(left) * 1000;
        SeamRecord {
            fingerprint: seam_fingerprint(self.fingerprint),
            token: seam_token(self.token),
            version: 0,
            created_at: 0,
            expires_at: millis(self.ttl_left),
            body: match self.response {
                Some(_) => RecordBody::Completed(StoredResponse {
                    status: 201,
                    headers: Vec::new(),
                    body: None,
                }),
                None => RecordBody::InProgress {
                    lease_expires_at: millis(self.lease_left),
                    steps: if self.steps == 0 && self.intents == 0 {
                        Bytes::new()
                    } else {
                        Bytes::from_static(b"recorded")
                    },
                },
            },
        }
    }
}

/// A store call as the engine sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// `Store::claim`.
    Claim {
        /// The request's fingerprint.
        fingerprint: u8,
        /// The token the claim carries.
        token: u8,
    },
    /// `renew`.
    Renew {
        /// The claim's token.
        token: u8,
    },
    /// `complete`, recording the response named by the token.
    Complete {
        /// The claim's token.
        token: u8,
    },
    /// `release`.
    Release {
        /// The claim's token.
        token: u8,
    },
    /// `record_step`, recording the output of `step`.
    RecordStep {
        /// The claim's token.
        token: u8,
        /// The step that ran.
        step: u8,
    },
    /// `record_step` of an at-most-once step's intent, before its side effect.
    RecordIntent {
        /// The claim's token.
        token: u8,
        /// The step about to run.
        step: u8,
    },
}

/// What the store answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// The claim owns the key, with the steps an earlier execution recorded (a set).
    Claimed {
        /// The steps returned with the claim.
        steps: u8,
        /// The intents returned with the claim.
        intents: u8,
    },
    /// A completed record: its response, and how long it lives on (store's wall clock).
    Replay {
        /// The recorded response.
        response: u8,
        /// Ticks until its TTL runs out.
        life: Tick,
    },
    /// `409`.
    InProgress,
    /// `422`.
    Mismatch,
    /// `renew`, `complete`, `release` or `record_step`: whether the token still owned
    /// the record.
    Done(bool),
}

/// A call in flight, sent `age` ticks ago (counted up to where nothing more changes);
/// applied by the store once `answer` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Call {
    /// What was sent.
    pub op: Op,
    /// Ticks since it was sent.
    pub age: Tick,
    /// The store's answer once it applied the call (the answer may still be lost).
    pub answer: Option<Answer>,
}

/// A claimed request as its engine holds it; ages in ticks, counted up to where nothing
/// more changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Held {
    /// The request's fingerprint.
    pub fingerprint: u8,
    /// The claim's token.
    pub token: u8,
    /// Since the claim was sent (the TTL counts from there).
    pub claim_age: Tick,
    /// Since the call behind the lease the engine knows of was sent.
    pub grant_age: Tick,
    /// The lease signal was raised (sticky).
    pub raised: bool,
    /// The store said the token owns nothing: the heartbeat stopped.
    pub heartbeat_ended: bool,
    /// The handler started in this tick: it may do its side effect at once, without
    /// checking `lease_lost()` (the engine's claim check is what licenses that).
    pub fresh: bool,
    /// The steps the claim's answer returned: the handler skips them.
    pub loaded: u8,
    /// The intents the claim's answer returned: the handler verifies those steps.
    pub loaded_intents: u8,
    /// The intent of the step the handler runs next is recorded (or verified as not
    /// acted on): its effect may happen.
    pub intent_ok: bool,
    /// The step the handler runs next (or whose record it awaits); `steps` once it
    /// returned.
    pub next: u8,
    /// Since the handler finished with a response to record.
    pub finished_age: Option<Tick>,
}

/// What an engine is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Work {
    /// Waiting for a request.
    Idle,
    /// Claiming for a request.
    Claiming {
        /// The request's fingerprint.
        fingerprint: u8,
        /// How far the replay cache's clock moved since the claim was sent.
        cache_moved: Tick,
    },
    /// Running the handler, or recording its answer.
    Holding(Held),
    /// Giving the claim back.
    Releasing,
}

/// A replay cache entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cached {
    /// The fingerprint it answers.
    pub fingerprint: u8,
    /// The recorded response.
    pub response: u8,
    /// Its life left, on the cache's clock.
    pub left: Tick,
}

/// One engine: its request, its store calls (the request's and the heartbeat's) and
/// its replay cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Engine {
    /// How many of its clients' requests it has taken.
    pub taken: u8,
    /// What it is doing.
    pub work: Work,
    /// The request's store call in flight.
    pub call: Option<Call>,
    /// The heartbeat's renewal in flight.
    pub renewal: Option<Call>,
    /// The replay cache (one key: one entry).
    pub cache: Option<Cached>,
}

/// What the invariants need to remember of the past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct History {
    /// The steps whose side effect happened since the record's lifetime began, its
    /// lease was last taken over or a release deleted it (a set).
    pub effects_under_lease: u8,
    /// The steps whose output the store appended in this record lifetime (a set).
    pub lifetime_steps: u8,
    /// The steps whose side effect happened in this record lifetime (a set): what an
    /// at-most-once step's `verify` finds out.
    pub lifetime_effects: u8,
    /// An at-most-once step's `verify` found an effect and its output was recorded.
    pub verified: bool,
    /// A response was recorded in this lifetime.
    pub recorded: bool,
    /// Ticks since the operator forgot the key, while within the replay cache's maximum
    /// age.
    pub forgotten: Option<Tick>,
    /// Side effects in all, up to one more than a handler's steps (for the coverage
    /// properties).
    pub effects: u8,
    /// A lease was taken over from its holder.
    pub lease_taken_over: bool,
    /// After a release kept a record, a claim took it over and got its steps back.
    pub resumed_after_release: bool,
    /// What is left, on the store's wall clock, of a TTL from the last claim or renewal
    /// the store applied to the record: how long the record must live at least, so that
    /// a retry of a crashed owner's request resumes its steps (zero without a record).
    pub life_left: Tick,
    /// The invariants broken, by the step that broke them (a set of [`Violation`]s).
    pub violations: u16,
}

/// An invariant broken by a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Violation {
    /// A second side effect of one step in one record lifetime under one lease: no
    /// takeover of a lost lease (or release that deleted the record) came between them,
    /// or a response was already recorded.
    SecondEffect,
    /// A side effect while the store did not hold the executing claim's lease.
    EffectWithoutLease,
    /// The store handed the key to another claim while its holder's licence held.
    TakenFromLiveHolder,
    /// A replay answered something other than the key's record.
    StaleReplay,
    /// An engine gave up recording an answer while it held the key.
    AnswerAbandoned,
    /// The store appended a step the record of this lifetime already held.
    StepRecordedTwice,
    /// A step's side effect happened while the record of this lifetime held its output.
    RecordedStepRerun,
    /// A record holding steps expired within a TTL of its owner's last claim or renewal:
    /// the retry of the crashed request would run its recorded steps again.
    StepsExpiredEarly,
    /// An at-most-once step's side effect happened a second time in one record lifetime.
    AtMostOnceRepeated,
}

impl Violation {
    fn bit(self) -> u16 {
        1 << self as u8
    }
}

impl History {
    /// Whether `violation` happened.
    pub fn broke(&self, violation: Violation) -> bool {
        self.violations & violation.bit() != 0
    }
}

/// The whole system. It keeps no absolute time, only what is left of each lease, TTL
/// and timeout, so that time runs on without end in a finite set of states.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The key's record.
    pub record: Option<Record>,
    /// The engines.
    pub engines: [Engine; ENGINES],
    /// Calls given up by their caller that the store may still apply (sorted).
    pub orphans: [Option<Op>; ORPHANS],
    /// The next claim's token.
    pub next_token: u8,
    /// Crashes so far.
    pub crashes: u8,
    /// Forgets so far.
    pub forgets: u8,
    /// Wall steps so far.
    pub steps: u8,
    /// What the invariants remember.
    pub history: History,
}

/// Which of an engine's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The request's (claim, complete, release).
    Request,
    /// The heartbeat's renewal.
    Renewal,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A tick passes, and the engines' timers fire (timeouts, the heartbeat).
    Tick,
    /// The in-process store's wall clock steps by this many ticks.
    StepWall(Tick),
    /// The operator forgets the key (`force = false`).
    Forget,
    /// An engine takes its next request.
    Start(usize),
    /// The store applies an engine's call.
    Apply(usize, Slot),
    /// The store's answer reaches the engine.
    Deliver(usize, Slot),
    /// The store applies a call its caller gave up on.
    ApplyOrphan(usize),
    /// A call its caller gave up on is lost.
    LoseOrphan(usize),
    /// The handler runs its next step (one it did not get back with the claim): the
    /// side effect, at once as it starts or later having checked `lease_lost()`; the
    /// engine sends `record_step`. Once the last step is recorded the handler returns
    /// its 2xx and the engine sends the completion.
    Effect(usize),
    /// The handler saw `lease_lost()`, or failed after a step, and returns a 5xx before
    /// its next step; the engine releases the claim.
    Fail(usize),
    /// The engine's process crashes and restarts, empty.
    Crash(usize),
}

impl Protocol {
    /// Whether the store judges leases on its wall clock (which steps).
    fn leases_on_wall(&self) -> bool {
        self.store == StoreKind::InProcess && !self.rules.leases_on_monotonic
    }

    /// `IdempotencyKey::lease_lost()` as the running handler sees it.
    fn lease_lost(&self, held: &Held) -> bool {
        held.raised || !self.licence_holds(held.grant_age)
    }

    /// How long a call may take before its caller gives up on it.
    fn timeout(&self, op: &Op) -> Tick {
        match op {
            Op::Renew { .. } => self.renewal_timeout(),
            _ => self.store_timeout,
        }
    }

    /// A tick passes: every age grows (up to where nothing more changes) and every time
    /// left shrinks (down to zero, run out); then each engine's timers fire: calls past
    /// their timeout are given up, and the heartbeat raises the lease signal at the
    /// licence's end and sends its renewal.
    fn tick(&self, s: &mut State) {
        let grow = |age: &mut Tick, cap: Tick| *age = (*age + 1).min(cap);
        if let Some(r) = &mut s.record {
            r.lease_left = (r.lease_left - 1).max(0);
            r.ttl_left = (r.ttl_left - 1).max(0);
        }
        s.history.life_left = (s.history.life_left - 1).max(0);
        for engine in &mut s.engines {
            for call in [&mut engine.call, &mut engine.renewal]
                .into_iter()
                .flatten()
            {
                call.age += 1;
            }
            match &mut engine.work {
                Work::Claiming { cache_moved, .. } => grow(cache_moved, self.ttl + 1),
                Work::Holding(held) => {
                    held.fresh = false;
                    grow(&mut held.claim_age, self.ttl + 1);
                    grow(&mut held.grant_age, self.lease);
                    if let Some(age) = &mut held.finished_age {
                        grow(age, self.retry_window + 1);
                    }
                }
                Work::Idle | Work::Releasing => {}
            }
            engine.cache = engine
                .cache
                .map(|c| Cached {
                    left: c.left - 1,
                    ..c
                })
                .filter(|c| c.left > 0);
        }
        s.history.forgotten = s
            .history
            .forgotten
            .map(|age| age + 1)
            .filter(|&age| age <= self.cache_max_age);
        for e in 0..ENGINES {
            self.time_out(s, e);
            self.heartbeat(s, e);
        }
    }

    /// The engine's timeouts: a renewal past its own is dropped (the next one goes out);
    /// a claim or release past the store timeout answers `503`; a completion past it is
    /// tried again, or given up when the rule allows.
    fn time_out(&self, s: &mut State, e: usize) {
        let late = |call: &Option<Call>| matches!(call, Some(c) if c.age > self.timeout(&c.op));
        if late(&s.engines[e].renewal) {
            let renewal = s.engines[e].renewal.take();
            Self::orphan(s, renewal);
        }
        if !late(&s.engines[e].call) {
            return;
        }
        let call = s.engines[e].call.take();
        Self::orphan(s, call);
        let Work::Holding(held) = s.engines[e].work else {
            return Self::settle(s, e);
        };
        if let Some(Call {
            op: Op::RecordStep { .. } | Op::RecordIntent { .. },
            ..
        }) = call
        {
            // The step's store error fails the handler: a 5xx, which the engine releases.
            return Self::fail(s, e, held.token);
        }
        let (stop, abandons) = self.stop_recording(&held, held.finished_age.unwrap_or(0));
        if !stop {
            return Self::send(s, e, Op::Complete { token: held.token });
        }
        if abandons {
            Self::violate(s, Violation::AnswerAbandoned);
        }
        Self::settle(s, e);
    }

    /// The heartbeat: raises the lease signal once the licence ended, and keeps one
    /// renewal in flight (its period, a third of the lease, is a tick here) until the
    /// store says the claim is no longer held.
    fn heartbeat(&self, s: &mut State, e: usize) {
        let engine = &mut s.engines[e];
        let Work::Holding(held) = &mut engine.work else {
            return;
        };
        if !self.licence_holds(held.grant_age) {
            held.raised = true;
        }
        if !held.heartbeat_ended && engine.renewal.is_none() {
            engine.renewal = Some(Call {
                op: Op::Renew { token: held.token },
                age: 0,
                answer: None,
            });
        }
    }

    /// The in-process store's wall clock steps by `by`: TTLs move, and so does what
    /// counts on that clock (the replay cache; leases, without the fix).
    fn step_wall(&self, s: &mut State, by: Tick) {
        if let Some(r) = &mut s.record {
            r.ttl_left = (r.ttl_left - by).max(0);
            if self.leases_on_wall() {
                r.lease_left = (r.lease_left - by).max(0);
            }
            s.history.life_left = (s.history.life_left - by).max(0);
        }
        for engine in &mut s.engines {
            if let Work::Claiming { cache_moved, .. } = &mut engine.work {
                *cache_moved += by;
            }
            engine.cache = engine
                .cache
                .map(|c| Cached {
                    left: c.left - by,
                    ..c
                })
                .filter(|c| c.left > 0);
        }
    }

    /// The store applies `op`, as one atomic step.
    fn apply(&self, s: &mut State, op: Op) -> Answer {
        let owned = |record: &Option<Record>, token: u8| {
            record
                .as_ref()
                .is_some_and(|r| rules::owned_by(&r.seam(), seam_token(token)))
        };
        match op {
            Op::Claim { fingerprint, token } => {
                let fresh = Record {
                    fingerprint,
                    token,
                    response: None,
                    lease_left: self.lease,
                    ttl_left: self.ttl,
                    steps: 0,
                    intents: 0,
                };
                let Some(found) = s.record else {
                    s.record = Some(fresh);
                    s.history.life_left = self.ttl;
                    return Answer::Claimed {
                        steps: 0,
                        intents: 0,
                    };
                };
                let decision =
                    rules::claim(&found.seam(), SEAM_NOW, &seam_fingerprint(fingerprint));
                match decision {
                    Decision::Take(reason) => {
                        // Only a lease is a holder's: a completed record is nobody's.
                        let from_live_holder = found.response.is_none()
                            && s.engines.iter().any(|engine| {
                                matches!(engine.work, Work::Holding(held) if held.token == found.token && !self.lease_lost(&held))
                            });
                        if from_live_holder {
                            Self::violate(s, Violation::TakenFromLiveHolder);
                        }
                        let holds_steps =
                            found.response.is_none() && (found.steps | found.intents) != 0;
                        if reason == Takeover::Expired && holds_steps && s.history.life_left > 0 {
                            Self::violate(s, Violation::StepsExpiredEarly);
                        }
                        s.history.life_left = self.ttl;
                        let keep = self.rules.steps_survive_lease_loss && steps_survive(reason);
                        let (steps, intents) = if keep {
                            (found.steps, found.intents)
                        } else {
                            (0, 0)
                        };
                        s.record = Some(Record {
                            steps,
                            intents,
                            ..fresh
                        });
                        s.history.effects_under_lease = 0;
                        if reason == Takeover::Expired {
                            s.history.recorded = false;
                            s.history.lifetime_steps = 0;
                            s.history.lifetime_effects = 0;
                        } else {
                            s.history.lease_taken_over = true;
                            s.history.resumed_after_release |=
                                found.token == RELEASED && steps != 0;
                        }
                        Answer::Claimed { steps, intents }
                    }
                    Decision::Mismatch => Answer::Mismatch,
                    Decision::Replay => Answer::Replay {
                        response: found.response.unwrap_or(found.token),
                        life: found.ttl_left,
                    },
                    Decision::InProgress => Answer::InProgress,
                }
            }
            Op::Renew { token } => {
                let held = owned(&s.record, token);
                if let (true, Some(r)) = (held, s.record.as_mut()) {
                    let keep = if self.rules.renewal_keeps_a_ttl {
                        self.ttl
                    } else {
                        self.lease
                    };
                    let renewal = Change::Renew {
                        lease: Self::duration(self.lease),
                        ttl: Self::duration(keep),
                    };
                    let renewed = r.seam().changed(&renewal, SEAM_NOW);
                    r.lease_left = ticks(rules::lease_left(&renewed, SEAM_NOW).unwrap_or(0));
                    r.ttl_left = ticks(renewed.expires_at);
                    s.history.life_left = self.ttl;
                }
                Answer::Done(held)
            }
            Op::Complete { token } => {
                let held = owned(&s.record, token);
                if let (true, Some(r)) = (held, s.record.as_mut()) {
                    r.response = Some(token);
                    r.steps = 0;
                    r.intents = 0;
                    s.history.recorded = true;
                }
                Answer::Done(held)
            }
            Op::Release { token } => {
                let held = owned(&s.record, token);
                match s.record.as_mut() {
                    Some(r) if held && rules::release(&r.seam()) == Release::EndLease => {
                        // The released owner is fenced off: its late renewals and
                        // steps own nothing.
                        r.lease_left = 0;
                        r.token = RELEASED;
                    }
                    _ if held => {
                        // The next claim starts afresh: a step whose record never
                        // reached the store may run again (at least once).
                        s.record = None;
                        s.history.life_left = 0;
                        s.history.effects_under_lease = 0;
                        s.history.lifetime_steps = 0;
                        s.history.lifetime_effects = 0;
                    }
                    _ => {}
                }
                Answer::Done(held)
            }
            Op::RecordIntent { token, step } => {
                let held = owned(&s.record, token);
                if let (true, Some(r)) = (held, s.record.as_mut()) {
                    r.intents |= bit(step);
                }
                Answer::Done(held)
            }
            Op::RecordStep { token, step } => {
                let appends = if self.rules.record_step_fenced {
                    owned(&s.record, token)
                } else {
                    matches!(s.record, Some(r) if r.response.is_none())
                };
                if let (true, Some(r)) = (appends, s.record.as_mut()) {
                    let twice = r.steps & bit(step) != 0;
                    r.steps |= bit(step);
                    s.history.lifetime_steps |= bit(step);
                    if twice {
                        Self::violate(s, Violation::StepRecordedTwice);
                    }
                }
                Answer::Done(appends)
            }
        }
    }

    /// The handler skips the steps it got back with its claim; past the last step it
    /// returns its 2xx and the engine sends the completion.
    fn advance(&self, s: &mut State, e: usize) {
        let Work::Holding(held) = &mut s.engines[e].work else {
            return;
        };
        while held.next < self.effects() && held.loaded & bit(held.next) != 0 {
            held.next += 1;
        }
        // The steps skipped are of no more use: forgetting them merges equal states.
        held.loaded &= u8::MAX.checked_shl(u32::from(held.next)).unwrap_or(0);
        held.loaded_intents &= u8::MAX.checked_shl(u32::from(held.next)).unwrap_or(0);
        if held.next == self.effects() {
            held.finished_age = Some(0);
            let token = held.token;
            Self::send(s, e, Op::Complete { token });
        }
    }

    /// What an at-most-once step does before its side effect: with its intent found in
    /// the claim's answer, `verify` (the effect happened in this lifetime: its output is
    /// recorded, no effect; it did not: on to the effect); otherwise `record_step` of
    /// the intent, the effect waiting for the store's yes.
    fn before_the_call(&self, s: &mut State, e: usize, held: Held) {
        let step = bit(held.next);
        if held.loaded_intents & step == 0 {
            let (token, step) = (held.token, held.next);
            return Self::send(s, e, Op::RecordIntent { token, step });
        }
        if s.history.lifetime_effects & step != 0 {
            s.history.verified = true;
            let (token, step) = (held.token, held.next);
            return Self::send(s, e, Op::RecordStep { token, step });
        }
        if let Work::Holding(h) = &mut s.engines[e].work {
            h.intent_ok = true;
        }
    }

    /// The handler returns a 5xx: the engine releases the claim.
    fn fail(s: &mut State, e: usize, token: u8) {
        Self::settle(s, e);
        s.engines[e].work = Work::Releasing;
        Self::send(s, e, Op::Release { token });
    }

    fn orphan(s: &mut State, call: Option<Call>) {
        let Some(Call {
            op, answer: None, ..
        }) = call
        else {
            // Not sent, or applied already (its answer is what is lost).
            return;
        };
        if let Some(free) = s.orphans.iter_mut().find(|o| o.is_none()) {
            *free = Some(op);
        }
        s.orphans.sort();
    }

    /// The engine is done with its request: a renewal in flight is left to the network.
    fn settle(s: &mut State, e: usize) {
        let renewal = s.engines[e].renewal.take();
        Self::orphan(s, renewal);
        s.engines[e].work = Work::Idle;
    }

    fn violate(s: &mut State, violation: Violation) {
        s.history.violations |= violation.bit();
    }

    fn send(s: &mut State, e: usize, op: Op) {
        s.engines[e].call = Some(Call {
            op,
            age: 0,
            answer: None,
        });
    }

    /// The engine takes its next request: a replay from its cache, or a claim.
    fn start(s: &mut State, e: usize, fingerprint: u8) {
        let hit = s.engines[e].cache.filter(|c| c.fingerprint == fingerprint);
        if let Some(cached) = hit {
            let same = matches!(
                s.record,
                Some(r) if r.ttl_left > 0 && r.fingerprint == fingerprint && r.response == Some(cached.response)
            );
            if !same && s.history.forgotten.is_none() {
                Self::violate(s, Violation::StaleReplay);
            }
            return;
        }
        let token = s.next_token;
        s.next_token += 1;
        s.engines[e].work = Work::Claiming {
            fingerprint,
            cache_moved: 0,
        };
        Self::send(s, e, Op::Claim { fingerprint, token });
    }

    /// The store's answer to the request's call reaches the engine.
    fn deliver_request(&self, s: &mut State, e: usize, call: Call, answer: Answer) {
        match (s.engines[e].work, call.op, answer) {
            (
                Work::Claiming { fingerprint, .. },
                Op::Claim { token, .. },
                Answer::Claimed { steps, intents },
            ) => {
                if self.rules.late_claim_check && !self.licence_holds(call.age) {
                    s.engines[e].work = Work::Releasing;
                    Self::send(s, e, Op::Release { token });
                    return;
                }
                s.engines[e].work = Work::Holding(Held {
                    fingerprint,
                    token,
                    claim_age: call.age,
                    grant_age: call.age,
                    raised: false,
                    heartbeat_ended: false,
                    fresh: true,
                    loaded: steps,
                    loaded_intents: intents,
                    intent_ok: false,
                    next: 0,
                    finished_age: None,
                });
                self.advance(s, e);
            }
            (Work::Holding(_), Op::RecordStep { .. }, Answer::Done(true)) => {
                if let Work::Holding(held) = &mut s.engines[e].work {
                    held.next += 1;
                    held.intent_ok = false;
                }
                self.advance(s, e);
            }
            (Work::Holding(_), Op::RecordIntent { .. }, Answer::Done(true)) => {
                if let Work::Holding(held) = &mut s.engines[e].work {
                    held.intent_ok = true;
                }
            }
            (
                Work::Claiming {
                    fingerprint,
                    cache_moved,
                },
                _,
                Answer::Replay { response, life },
            ) => {
                let left = (life - cache_moved).min(self.cache_age_left(cache_moved));
                s.engines[e].cache = (left > 0).then_some(Cached {
                    fingerprint,
                    response,
                    left,
                });
                s.engines[e].work = Work::Idle;
            }
            (Work::Holding(held), Op::Complete { token }, Answer::Done(recorded)) => {
                // A database store's engine also keeps its own completions, for as long
                // as the record lives at least: its TTL from the claim's send.
                if recorded && self.store == StoreKind::Server {
                    let left = (self.ttl - held.claim_age).min(self.cache_age_left(call.age));
                    s.engines[e].cache = (left > 0).then_some(Cached {
                        fingerprint: held.fingerprint,
                        response: token,
                        left,
                    });
                }
                Self::settle(s, e);
            }
            _ => Self::settle(s, e),
        }
    }

    /// The heartbeat's renewal answer reaches the engine.
    fn deliver_renewal(s: &mut State, e: usize, call: Call, answer: Answer) {
        if let Work::Holding(held) = &mut s.engines[e].work {
            match answer {
                Answer::Done(true) => held.grant_age = held.grant_age.min(call.age),
                _ => {
                    held.raised = true;
                    held.heartbeat_ended = true;
                }
            }
        }
    }

    fn held(s: &State, e: usize) -> Option<Held> {
        match s.engines[e].work {
            Work::Holding(held) => Some(held),
            _ => None,
        }
    }

    fn slot(s: &State, e: usize, slot: Slot) -> Option<Call> {
        match slot {
            Slot::Request => s.engines[e].call,
            Slot::Renewal => s.engines[e].renewal,
        }
    }

    fn slot_mut(s: &mut State, e: usize, slot: Slot) -> &mut Option<Call> {
        match slot {
            Slot::Request => &mut s.engines[e].call,
            Slot::Renewal => &mut s.engines[e].renewal,
        }
    }

    /// How long a cache entry may live by its maximum age, its record read by a call
    /// whose send lies `since_send` back on the cache's clock.
    fn cache_age_left(&self, since_send: Tick) -> Tick {
        if self.rules.cache_age_from_read {
            self.cache_max_age - since_send
        } else {
            self.cache_max_age
        }
    }

    /// Whether the engine may stop recording now (by the rule in force), and whether
    /// doing so abandons an answer while the engine holds the key.
    fn stop_recording(&self, held: &Held, finished_age: Tick) -> (bool, bool) {
        let past_window = finished_age > self.retry_window;
        let past_ttl = held.claim_age > self.ttl;
        let lost = self.lease_lost(held);
        let may = if self.rules.record_while_held {
            may_stop_recording(past_window, past_ttl, lost)
        } else {
            past_window
        };
        (may, !lost && !past_ttl)
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let idle = Engine {
            taken: 0,
            work: Work::Idle,
            call: None,
            renewal: None,
            cache: None,
        };
        vec![State {
            record: None,
            engines: [idle; ENGINES],
            orphans: [None; ORPHANS],
            next_token: 0,
            crashes: 0,
            forgets: 0,
            steps: 0,
            history: History::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // A broken invariant ends the run: its trace is the counterexample.
        if s.history.violations != 0 {
            return;
        }
        actions.push(Action::Tick);
        if usize::from(s.steps) < self.wall_steps.len().min(1) {
            actions.extend(self.wall_steps.iter().map(|&d| Action::StepWall(d)));
        }
        if s.forgets < self.forgets
            && matches!(s.record, Some(r) if r.response.is_some() || r.lease_left <= 0)
        {
            actions.push(Action::Forget);
        }
        for (i, orphan) in s.orphans.iter().enumerate() {
            if orphan.is_some() {
                actions.push(Action::ApplyOrphan(i));
                actions.push(Action::LoseOrphan(i));
            }
        }
        for e in 0..ENGINES {
            let engine = &s.engines[e];
            if engine.work == Work::Idle && usize::from(engine.taken) < self.requests[e].len() {
                actions.push(Action::Start(e));
            }
            if engine.work != Work::Idle && s.crashes < self.crashes {
                actions.push(Action::Crash(e));
            }
            for slot in [Slot::Request, Slot::Renewal] {
                match Self::slot(s, e, slot).map(|call| call.answer) {
                    Some(None) => actions.push(Action::Apply(e, slot)),
                    // A timeout polls its call first: an answer there when the timer
                    // fires still counts.
                    Some(Some(_)) => actions.push(Action::Deliver(e, slot)),
                    None => {}
                }
            }
            let Some(held) = Self::held(s, e) else {
                continue;
            };
            // Between steps: not awaiting a step's record, not returned yet.
            if held.finished_age.is_none() && engine.call.is_none() {
                let lost = self.lease_lost(&held);
                if held.fresh || !lost {
                    actions.push(Action::Effect(e));
                }
                if lost || (self.fail_between_steps && held.next > 0) {
                    actions.push(Action::Fail(e));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => self.tick(&mut s),
            Action::StepWall(by) => {
                self.step_wall(&mut s, by);
                s.steps += 1;
            }
            Action::Forget => {
                s.record = None;
                s.history.life_left = 0;
                s.forgets += 1;
                s.history.forgotten = Some(0);
                s.history.effects_under_lease = 0;
                s.history.lifetime_steps = 0;
                s.history.lifetime_effects = 0;
                s.history.recorded = false;
            }
            Action::ApplyOrphan(i) => {
                let op = s.orphans[i].take()?;
                s.orphans.sort();
                self.apply(&mut s, op);
            }
            Action::LoseOrphan(i) => {
                s.orphans[i] = None;
                s.orphans.sort();
            }
            Action::Start(e) => {
                let fingerprint = self.requests[e][usize::from(s.engines[e].taken)];
                s.engines[e].taken += 1;
                Self::start(&mut s, e, fingerprint);
            }
            Action::Apply(e, slot) => {
                let op = Self::slot(&s, e, slot)?.op;
                let answer = self.apply(&mut s, op);
                Self::slot_mut(&mut s, e, slot).as_mut()?.answer = Some(answer);
            }
            Action::Deliver(e, slot) => {
                let call = Self::slot_mut(&mut s, e, slot).take()?;
                let answer = call.answer?;
                match slot {
                    Slot::Request => self.deliver_request(&mut s, e, call, answer),
                    Slot::Renewal => Self::deliver_renewal(&mut s, e, call, answer),
                }
            }
            Action::Effect(e) => {
                let held = Self::held(&s, e)?;
                let step = bit(held.next);
                let at_most_once = self.steps > 0 && self.at_most_once & step != 0;
                if at_most_once && self.rules.intent_before_call && !held.intent_ok {
                    self.before_the_call(&mut s, e, held);
                    return Some(s);
                }
                if at_most_once && s.history.lifetime_effects & step != 0 {
                    Self::violate(&mut s, Violation::AtMostOnceRepeated);
                }
                s.history.lifetime_effects |= step;
                let under_lease = matches!(
                    s.record,
                    Some(r) if r.token == held.token && r.response.is_none() && r.lease_left > 0
                );
                if !under_lease {
                    Self::violate(&mut s, Violation::EffectWithoutLease);
                }
                if s.history.effects_under_lease & step != 0 || s.history.recorded {
                    Self::violate(&mut s, Violation::SecondEffect);
                }
                if s.history.lifetime_steps & step != 0 {
                    Self::violate(&mut s, Violation::RecordedStepRerun);
                }
                s.history.effects_under_lease |= step;
                s.history.effects = (s.history.effects + 1).min(self.effects() + 1);
                if self.steps == 0 {
                    // Not a step: the handler returns its 2xx at once.
                    if let Work::Holding(h) = &mut s.engines[e].work {
                        h.next += 1;
                    }
                    self.advance(&mut s, e);
                } else {
                    Self::send(
                        &mut s,
                        e,
                        Op::RecordStep {
                            token: held.token,
                            step: held.next,
                        },
                    );
                }
            }
            Action::Fail(e) => {
                let held = Self::held(&s, e)?;
                Self::fail(&mut s, e, held.token);
            }
            Action::Crash(e) => {
                let engine = s.engines[e];
                Self::orphan(&mut s, engine.call);
                Self::orphan(&mut s, engine.renewal);
                s.engines[e] = Engine {
                    taken: engine.taken,
                    work: Work::Idle,
                    call: None,
                    renewal: None,
                    cache: None,
                };
                s.crashes += 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            // (1) At most one side effect of each step per record lifetime (between TTL
            // expiry or a forget), except a retry's after a takeover of a lost lease (the
            // owner crashed or no renewal of it reached the store for a lease) or after a
            // release that deleted the record, and none once a response was recorded.
            Property::always(
                "one side effect per step per lease of a record lifetime",
                |_, s: &State| !s.history.broke(Violation::SecondEffect),
            ),
            // (2) A side effect happens only while its claim's token holds a live lease in
            // the store.
            Property::always("side effects only under a live lease", |_, s: &State| {
                !s.history.broke(Violation::EffectWithoutLease)
            }),
            // (2') The store hands a key to another claim only once its holder's licence
            // ended (or the holder crashed): the rule that makes (2) hold.
            Property::always("no takeover from a live holder", |_, s: &State| {
                !s.history.broke(Violation::TakenFromLiveHolder)
            }),
            // (3) A replay is the key's record, or a copy of one forgotten within the
            // replay cache's maximum age.
            Property::always("replays are the record", |_, s: &State| {
                !s.history.broke(Violation::StaleReplay)
            }),
            // (4) An engine that finished a handler keeps trying to record its answer while
            // it holds the key (its licence holds) and the record's TTL has not ended.
            Property::always(
                "answers are recorded while the key is held",
                |_, s: &State| !s.history.broke(Violation::AnswerAbandoned),
            ),
            // (5) No key is wedged: a live lease ends within one lease, by the store's
            // lease clock, whatever the wall clock did.
            Property::always("leases always run out", |m: &Protocol, s: &State| {
                match s.record {
                    Some(r) if r.response.is_none() => r.lease_left <= m.lease,
                    _ => true,
                }
            }),
            // (6) At most one recorded output per step per record lifetime: the store
            // never appends a step the record already holds.
            Property::always("one recorded output per step", |_, s: &State| {
                !s.history.broke(Violation::StepRecordedTwice)
            }),
            // (7) A resumed execution never reruns a recorded step: no step's side effect
            // happens while the record of its lifetime holds that step's output.
            Property::always("recorded steps are not run again", |_, s: &State| {
                !s.history.broke(Violation::RecordedStepRerun)
            }),
            // (8) A record holding steps lives at least a TTL past its owner's last claim
            // or renewal: a handler that outlived its TTL and crashed is resumed by the
            // retry of its request, not run again from the start.
            Property::always("steps outlive their owner by a TTL", |_, s: &State| {
                !s.history.broke(Violation::StepsExpiredEarly)
            }),
            // (9) An at-most-once step's side effect happens at most once per record
            // lifetime.
            Property::always(
                "at-most-once steps act once per record lifetime",
                |_, s: &State| !s.history.broke(Violation::AtMostOnceRepeated),
            ),
            // Coverage: the bounds reach what the invariants are about.
            Property::sometimes("a side effect happens", |_, s: &State| {
                s.history.effects > 0
            }),
            Property::sometimes("a replay is kept in a replay cache", |_, s: &State| {
                s.engines.iter().any(|e| e.cache.is_some())
            }),
        ];
        // An at-most-once handler's retry verifies instead of acting again.
        if self.at_most_once == 0 {
            properties.push(Property::sometimes(
                "a lost lease is taken over and run again",
                |m: &Protocol, s: &State| {
                    s.history.lease_taken_over && s.history.effects > m.effects()
                },
            ));
        }
        if self.steps > 0 && self.at_most_once != 0 && self.rules.intent_before_call {
            properties.push(Property::sometimes(
                "an unrecorded at-most-once effect is verified, not repeated",
                |_, s: &State| s.history.verified,
            ));
        }
        if self.steps > 0 && self.fail_between_steps {
            properties.push(Property::sometimes(
                "a record a release kept is resumed after its steps",
                |_, s: &State| s.history.resumed_after_release,
            ));
        }
        properties
    }
}

/// A counterexample as a timeline: each step, with the record and the engines' work
/// after it.
pub fn trace(path: stateright::Path<State, Action>) -> String {
    let steps = path.into_vec();
    let mut out = String::new();
    let mut now = 0;
    for pair in steps.windows(2) {
        let ((_, Some(action)), (after, _)) = (&pair[0], &pair[1]) else {
            continue;
        };
        if *action == Action::Tick {
            now += 1;
            continue;
        }
        let record = match after.record {
            None => "none".to_owned(),
            Some(r) => format!(
                "fingerprint {} token {} {} lease left {} ttl left {} steps {:#b} intents {:#b}",
                r.fingerprint,
                r.token,
                match r.response {
                    Some(response) => format!("completed({response})"),
                    None => "in_progress".to_owned(),
                },
                r.lease_left,
                r.ttl_left,
                r.steps,
                r.intents
            ),
        };
        let _ = writeln!(out, "t={now:<2} {action:?}");
        let _ = writeln!(out, "      record: {record}");
        for (i, engine) in after.engines.iter().enumerate() {
            let _ = writeln!(out, "      engine {i}: {:?}", engine.work);
        }
    }
    if let Some((last, _)) = steps.last() {
        let broken: Vec<_> = [
            Violation::SecondEffect,
            Violation::EffectWithoutLease,
            Violation::TakenFromLiveHolder,
            Violation::StaleReplay,
            Violation::AnswerAbandoned,
            Violation::StepRecordedTwice,
            Violation::RecordedStepRerun,
            Violation::StepsExpiredEarly,
            Violation::AtMostOnceRepeated,
        ]
        .into_iter()
        .filter(|&v| last.history.broke(v))
        .collect();
        let _ = writeln!(out, "broken: {broken:?}");
    }
    out
}
