//! The Python exceptions of `tandem`, and how the crates' errors become them.
//!
//! `TandemError` (a `RuntimeError`) is the base of every failure that is not the caller's argument:
//! `NotInitializedError` (a call that needs `init()` first), `ContractError` (the launch contract
//! is missing or wrong: the script runs outside a Tandem job), `CommunicationError` (a collective
//! failed) and its `PeerLostError` (a peer of the group died, hung or never came, or a parameter
//! server was lost: restarting the group can cure it), and `ParameterServerError` (a parameter
//! server refused this rank or its update, or the job's PS settings do not fit the call). A bad
//! argument is a `TypeError` or `ValueError`.

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tandem_api::ExitClass;
use tandem_comm::CommError;
use tandem_ps::group::ExchangeError;

create_exception!(tandem, TandemError, PyRuntimeError, "Base of every Tandem failure.");
create_exception!(
    tandem,
    NotInitializedError,
    TandemError,
    "A call that needs `tandem.torch.init()` came before it."
);
create_exception!(
    tandem,
    ContractError,
    TandemError,
    "The launch contract is missing or wrong: the script is not running as a Tandem job's worker."
);
create_exception!(tandem, CommunicationError, TandemError, "A collective of the group failed.");
create_exception!(
    tandem,
    PeerLostError,
    CommunicationError,
    "A peer of the group died, hung or never came, or a parameter server was lost; restarting the group can cure it."
);
create_exception!(
    tandem,
    ParameterServerError,
    TandemError,
    "A parameter server refused this rank or its update, or the job's PS settings do not fit the call."
);

/// Adds the exceptions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TandemError", py.get_type::<TandemError>())?;
    m.add("NotInitializedError", py.get_type::<NotInitializedError>())?;
    m.add("ContractError", py.get_type::<ContractError>())?;
    m.add("CommunicationError", py.get_type::<CommunicationError>())?;
    m.add("PeerLostError", py.get_type::<PeerLostError>())?;
    m.add("ParameterServerError", py.get_type::<ParameterServerError>())?;
    Ok(())
}

/// A failed collective `call`, as its exception.
pub fn comm(call: &str, e: &CommError) -> PyErr {
    if e.is_peer_lost() {
        PeerLostError::new_err(format!(
            "{call}: {e}. The group lost a peer; under Tandem the group restarts when this process exits \
             (tandem.torch's handler exits with the retryable code)"
        ))
    } else {
        CommunicationError::new_err(format!("{call}: {e}"))
    }
}

/// A failed exchange with the parameter servers in `call`, as its exception: a lost server or
/// peer is retryable ([`PeerLostError`]), a refusal or a diverged model is not.
pub fn ps(call: &str, e: &ExchangeError) -> PyErr {
    match e {
        ExchangeError::Collective(e) => comm(call, e),
        e if e.exit_class() == ExitClass::PeerLost => PeerLostError::new_err(format!(
            "tandem.torch.{call}: {e}. Under Tandem the group restarts when this process exits (tandem.torch's \
             handler exits with the retryable code) and continues from the servers' weights and step"
        )),
        e => ParameterServerError::new_err(format!("tandem.torch.{call}: {e}")),
    }
}

/// `call` does not fit the job's parameter-server settings: `what`.
pub fn ps_config(call: &str, what: &str) -> PyErr {
    ParameterServerError::new_err(format!("tandem.torch.{call}: {what}"))
}

/// The launch contract cannot be read: `what` went wrong.
pub fn contract(what: impl std::fmt::Display) -> PyErr {
    ContractError::new_err(format!(
        "tandem.torch.init() reads the launch contract that `tandem train` or the Tandem operator gives each \
         worker rank, and {what}. Run this script as a TrainingJob's workers.command \
         (`tandem train -f job.yaml`)"
    ))
}

/// `call` came before `init()`.
pub fn not_initialized(call: &str) -> PyErr {
    NotInitializedError::new_err(format!(
        "tandem.torch.{call}() needs the group: call tandem.torch.init() first"
    ))
}

/// A lock was poisoned by a panic in an earlier call.
pub fn poisoned() -> PyErr {
    TandemError::new_err(
        "an earlier tandem call panicked and left the communicator unusable; restart the process",
    )
}
