//! PLACEHOLDER: queue pair attributes and state machine (being written).

use ibverbs_sys as sys;

use crate::port::device_enum;

device_enum! {
    /// Queue pair state.
    QpState {
        /// Reset.
        Reset = sys::IBV_QPS_RESET,
        /// Initialised.
        Init = sys::IBV_QPS_INIT,
        /// Ready to receive.
        Rtr = sys::IBV_QPS_RTR,
        /// Ready to send.
        Rts = sys::IBV_QPS_RTS,
        /// Send queue drained.
        Sqd = sys::IBV_QPS_SQD,
        /// Send queue error.
        Sqe = sys::IBV_QPS_SQE,
        /// Error.
        Err = sys::IBV_QPS_ERR,
    }
}
