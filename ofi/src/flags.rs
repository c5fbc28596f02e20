//! libfabric's flag values, for capabilities, modes, registration access
//! and completion flags, named as in its headers so its manual pages apply.
//! The shim checks each value against the headers at compile time.

/// Capability and completion flag: messages.
pub const FI_MSG: u64 = 1 << 1;
/// Capability and completion flag: RMA (one-sided reads and writes).
pub const FI_RMA: u64 = 1 << 2;
/// Capability and completion flag: tagged messages.
pub const FI_TAGGED: u64 = 1 << 3;
/// Capability and completion flag: atomics.
pub const FI_ATOMIC: u64 = 1 << 4;
/// Capability, access and completion flag: an RMA read.
pub const FI_READ: u64 = 1 << 8;
/// Capability, access and completion flag: an RMA write.
pub const FI_WRITE: u64 = 1 << 9;
/// Access and completion flag: a receive.
pub const FI_RECV: u64 = 1 << 10;
/// Access and completion flag: a send.
pub const FI_SEND: u64 = 1 << 11;
/// Capability and access flag: the region may be read by peers.
pub const FI_REMOTE_READ: u64 = 1 << 12;
/// Capability and access flag: the region may be written by peers.
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
/// Completion flag: a multi-receive buffer.
pub const FI_MULTI_RECV: u64 = 1 << 16;
/// Completion flag: the entry carries a peer's immediate data.
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
/// Capability: device (GPU) memory.
pub const FI_HMEM: u64 = 1 << 47;
/// Capability: peers on this host.
pub const FI_LOCAL_COMM: u64 = 1 << 51;
/// Capability: peers on other hosts.
pub const FI_REMOTE_COMM: u64 = 1 << 52;

/// Mode: each operation's context is a `struct fi_context` the provider
/// may use until completion (this crate owns that storage).
pub const FI_CONTEXT: u64 = 1 << 59;
/// Mode: as `FI_CONTEXT`, with a `struct fi_context2`.
pub const FI_CONTEXT2: u64 = 1 << 52;
/// Mode: a message prefix is needed (not accepted here).
pub const FI_MSG_PREFIX: u64 = 1 << 58;
/// Mode: incoming immediate data consumes a posted receive.
pub const FI_RX_CQ_DATA: u64 = 1 << 56;
/// Mode (old form of `FI_MR_LOCAL`).
pub const FI_LOCAL_MR: u64 = 1 << 55;

/// mr_mode: local buffers need a registration descriptor.
pub const FI_MR_LOCAL: u64 = 1 << 2;
/// mr_mode: keys may be larger than 64 bits (not accepted here).
pub const FI_MR_RAW: u64 = 1 << 3;
/// mr_mode: remote addresses are virtual addresses, not offsets.
pub const FI_MR_VIRT_ADDR: u64 = 1 << 4;
/// mr_mode: only allocated (backed) memory may be registered.
pub const FI_MR_ALLOCATED: u64 = 1 << 5;
/// mr_mode: the provider chooses keys.
pub const FI_MR_PROV_KEY: u64 = 1 << 6;
/// mr_mode: registrations must be notified of unmaps (not accepted here).
pub const FI_MR_MMU_NOTIFY: u64 = 1 << 7;
/// mr_mode: RMA events on registrations (not accepted here).
pub const FI_MR_RMA_EVENT: u64 = 1 << 8;
/// mr_mode: a registration must be bound to an endpoint and enabled.
pub const FI_MR_ENDPOINT: u64 = 1 << 9;
/// mr_mode: device memory must be registered (not accepted yet).
pub const FI_MR_HMEM: u64 = 1 << 10;

/// [`crate::Error::Completion`] errno: the message was longer than the
/// receive buffer.
pub const FI_ETRUNC: i32 = 265;
/// [`crate::Error::Completion`] errno: the operation was cancelled (the
/// endpoint closed with it in flight).
pub const FI_ECANCELED: i32 = 125;

/// The capabilities gradwire asks for.
pub const WANTED_CAPS: u64 =
    FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ;
/// The mode bits gradwire can honour.
pub const ACCEPTED_MODE: u64 = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
/// The mr_mode bits gradwire can honour.
pub const ACCEPTED_MR_MODE: u64 =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

/// Names of the set bits of `bits`, from `names`, joined by `|`; bits
/// without a name are printed in hex.
pub(crate) fn bit_names(bits: u64, names: &[(u64, &str)]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut rest = bits;
    for &(bit, name) in names {
        if bits & bit != 0 {
            out.push(name.to_owned());
            rest &= !bit;
        }
    }
    if rest != 0 {
        out.push(format!("{rest:#x}"));
    }
    if out.is_empty() {
        "0".to_owned()
    } else {
        out.join("|")
    }
}

/// Names of mr_mode bits.
pub const MR_MODE_NAMES: &[(u64, &str)] = &[
    (FI_MR_LOCAL, "FI_MR_LOCAL"),
    (FI_MR_RAW, "FI_MR_RAW"),
    (FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"),
    (FI_MR_ALLOCATED, "FI_MR_ALLOCATED"),
    (FI_MR_PROV_KEY, "FI_MR_PROV_KEY"),
    (FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"),
    (FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"),
    (FI_MR_ENDPOINT, "FI_MR_ENDPOINT"),
    (FI_MR_HMEM, "FI_MR_HMEM"),
];

/// Names of mode bits.
pub const MODE_NAMES: &[(u64, &str)] = &[
    (FI_CONTEXT, "FI_CONTEXT"),
    (FI_CONTEXT2, "FI_CONTEXT2"),
    (FI_MSG_PREFIX, "FI_MSG_PREFIX"),
    (FI_RX_CQ_DATA, "FI_RX_CQ_DATA"),
    (FI_LOCAL_MR, "FI_LOCAL_MR"),
];

/// Names of capability bits gradwire asks for.
pub const CAP_NAMES: &[(u64, &str)] = &[
    (FI_MSG, "FI_MSG"),
    (FI_RMA, "FI_RMA"),
    (FI_READ, "FI_READ"),
    (FI_WRITE, "FI_WRITE"),
    (FI_REMOTE_READ, "FI_REMOTE_READ"),
    (FI_REMOTE_WRITE, "FI_REMOTE_WRITE"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_names_name_known_bits_and_print_the_rest() {
        assert_eq!(bit_names(0, MR_MODE_NAMES), "0");
        assert_eq!(
            bit_names(FI_MR_LOCAL | FI_MR_VIRT_ADDR | (1 << 30), MR_MODE_NAMES),
            "FI_MR_LOCAL|FI_MR_VIRT_ADDR|0x40000000"
        );
    }
}
