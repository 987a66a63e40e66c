//! Admin requests rust-rdkafka does not wrap: what a cluster lets this client's principal do
//! with topics (librdkafka's DescribeTopics with `include_authorized_operations`, KIP-430; the
//! brokers answer from their authorizer), and IncrementalAlterConfigs (KIP-339) with SET
//! operations, for the topic-config sync.

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;

use super::NativePtr;

/// One topic as DescribeTopics returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedTopic {
    pub topic: String,
    /// The topic's error (e.g. `TopicAuthorizationFailed`, `UnknownTopicOrPartition`).
    pub error: Option<RDKafkaErrorCode>,
    /// The operations the principal may perform on the topic, as Kafka names them (`READ`,
    /// `WRITE`, `DESCRIBE`, ...); `None` when the cluster did not say (no authorizer
    /// information, or an error), or when they were not asked for.
    pub operations: Option<Vec<String>>,
    /// The topic's id (KIP-516, Metadata v10+, Kafka 2.8+) in Kafka's base64 form; `None`
    /// when the cluster gave none (an older broker: all zero bits), or an error.
    pub id: Option<String>,
}

/// The authorized operations on `topics`, asked of the cluster `client` is connected to,
/// waiting at most `timeout`. `Err` holds librdkafka's reason for a failed request.
pub fn authorized_operations<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    timeout: Duration,
) -> Result<Vec<DescribedTopic>, String> {
    describe_topics(client, topics, timeout, true)
}

/// The ids of `topics` (and their errors), asked of the cluster `client` is connected to,
/// waiting at most `timeout`: a topic deleted and created again under the same name has a
/// new id. `Err` holds librdkafka's reason for a failed request.
pub fn topic_ids<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    timeout: Duration,
) -> Result<Vec<DescribedTopic>, String> {
    describe_topics(client, topics, timeout, false)
}

/// DescribeTopics of `topics`, with the authorized operations if `authorized`.
fn describe_topics<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    timeout: Duration,
    authorized: bool,
) -> Result<Vec<DescribedTopic>, String> {
    let names: Vec<CString> = topics
        .iter()
        .map(|t| CString::new(*t).map_err(|_| format!("topic name {t:?} holds a NUL byte")))
        .collect::<Result<_, _>>()?;
    let mut pointers: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    // DescribeTopics goes to the controller: a cluster that names none among its brokers
    // (librdkafka's mock cluster says 0) would leave the request waiting for one.
    let metadata = client
        .fetch_metadata(None, timeout)
        .map_err(|e| e.to_string())?;
    let rk = client.native_ptr();
    // SAFETY: `rk` is a live client while `client` is borrowed; a zero timeout only reads the
    // id learnt from the metadata fetched above.
    let controller = unsafe { rdsys::rd_kafka_controllerid(rk, 0) };
    if !metadata.brokers().iter().any(|b| b.id() == controller) {
        return Err(format!(
            "the cluster names no controller among its brokers (controller id {controller})"
        ));
    }
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `rk` is a live client while `client` is borrowed. Every handle made here is
    // owned by a NativePtr and released once; `pointers` and `names` outlive the calls that
    // read them (librdkafka copies the names into the collection). The result's descriptions
    // belong to `event` and are read before it is released.
    unsafe {
        let queue =
            NativePtr::from_ptr(rdsys::rd_kafka_queue_new(rk)).ok_or("librdkafka made no queue")?;
        let options = NativePtr::from_ptr(rdsys::rd_kafka_AdminOptions_new(
            rk,
            rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        ))
        .ok_or("librdkafka made no admin options")?;
        let mut errstr = [0 as std::ffi::c_char; 256];
        let code = rdsys::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr(),
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        if code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(CStr::from_ptr(errstr.as_ptr())
                .to_string_lossy()
                .into_owned());
        }
        let error = rdsys::rd_kafka_AdminOptions_set_include_authorized_operations(
            options.ptr(),
            i32::from(authorized),
        );
        if !error.is_null() {
            let reason = CStr::from_ptr(rdsys::rd_kafka_error_string(error))
                .to_string_lossy()
                .into_owned();
            rdsys::rd_kafka_error_destroy(error);
            return Err(reason);
        }
        let collection = NativePtr::from_ptr(rdsys::rd_kafka_TopicCollection_of_topic_names(
            pointers.as_mut_ptr(),
            pointers.len(),
        ))
        .ok_or("librdkafka made no topic collection")?;
        rdsys::rd_kafka_DescribeTopics(rk, collection.ptr(), options.ptr(), queue.ptr());
        // The request's own timeout answers first; the margin only guards against a lost
        // reply.
        let event = NativePtr::from_ptr(rdsys::rd_kafka_queue_poll(
            queue.ptr(),
            timeout_ms.saturating_add(1000),
        ))
        .ok_or_else(|| format!("no answer to DescribeTopics within {timeout:?}"))?;
        if rdsys::rd_kafka_event_error(event.ptr())
            != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            let reason = rdsys::rd_kafka_event_error_string(event.ptr());
            return Err(if reason.is_null() {
                "DescribeTopics failed".to_owned()
            } else {
                CStr::from_ptr(reason).to_string_lossy().into_owned()
            });
        }
        let result = rdsys::rd_kafka_event_DescribeTopics_result(event.ptr());
        if result.is_null() {
            return Err("DescribeTopics returned no result".to_owned());
        }
        let mut count = 0usize;
        let descriptions = rdsys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let description = *descriptions.add(i);
            let name = rdsys::rd_kafka_TopicDescription_name(description);
            let topic = if name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            };
            let error = rdsys::rd_kafka_TopicDescription_error(description);
            let error = if error.is_null() {
                None
            } else {
                let code = rdsys::rd_kafka_error_code(error);
                (code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
                    .then(|| RDKafkaErrorCode::from(code))
            };
            let mut n = 0usize;
            let ops = rdsys::rd_kafka_TopicDescription_authorized_operations(description, &mut n);
            let operations = (!ops.is_null()).then(|| {
                (0..n)
                    .map(|j| {
                        let name = rdsys::rd_kafka_AclOperation_name(*ops.add(j));
                        if name.is_null() {
                            "UNKNOWN".to_owned()
                        } else {
                            CStr::from_ptr(name).to_string_lossy().into_owned()
                        }
                    })
                    .collect()
            });
            // The id belongs to the description; all zero bits: the broker gave none.
            let uuid = rdsys::rd_kafka_TopicDescription_topic_id(description);
            let id = (!uuid.is_null()
                && (rdsys::rd_kafka_Uuid_most_significant_bits(uuid) != 0
                    || rdsys::rd_kafka_Uuid_least_significant_bits(uuid) != 0))
                .then(|| c_text(rdsys::rd_kafka_Uuid_base64str(uuid)))
                .filter(|id| !id.is_empty());
            out.push(DescribedTopic {
                topic,
                error,
                operations,
                id,
            });
        }
        drop(collection);
        drop(options);
        drop(event);
        drop(queue);
        Ok(out)
    }
}

/// A failed admin request as a whole: librdkafka's error code (if it gave one) and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminFailure {
    pub code: Option<RDKafkaErrorCode>,
    pub reason: String,
}

impl AdminFailure {
    fn reason(reason: impl Into<String>) -> AdminFailure {
        AdminFailure {
            code: None,
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for AdminFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// One topic's answer to [`set_topic_configs`]: `None` if the broker applied every SET, else
/// its error code and message (the whole topic's request is refused or applied: Kafka applies
/// one resource's operations together).
pub type TopicAlterResult = (String, Option<(RDKafkaErrorCode, String)>);

/// IncrementalAlterConfigs (KIP-339) with only SET operations: for each topic, sets the named
/// configs to the given values and leaves every other config of the topic as it is (unlike
/// AlterConfigs, which replaces the whole set). rust-rdkafka does not wrap it. Waits at most
/// `timeout`. `Err` is a failure of the request as a whole; each topic has its own result.
pub fn set_topic_configs<C: ClientContext>(
    client: &Client<C>,
    topics: &[(String, Vec<(String, String)>)],
    timeout: Duration,
) -> Result<Vec<TopicAlterResult>, AdminFailure> {
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    let nul = |what: &str| AdminFailure::reason(format!("{what:?} holds a NUL byte"));
    // Every C string the resources are made from, owned here until the request is sent.
    let mut requested = Vec::with_capacity(topics.len());
    for (topic, configs) in topics {
        let name = CString::new(topic.as_str()).map_err(|_| nul(topic))?;
        let configs = configs
            .iter()
            .map(|(k, v)| {
                Ok((
                    CString::new(k.as_str()).map_err(|_| nul(k))?,
                    CString::new(v.as_str()).map_err(|_| nul(v))?,
                ))
            })
            .collect::<Result<Vec<_>, AdminFailure>>()?;
        requested.push((name, configs));
    }
    let rk = client.native_ptr();
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    let text = |ptr: *const std::ffi::c_char| {
        if ptr.is_null() {
            String::new()
        } else {
            // SAFETY: librdkafka returns NUL-terminated strings that live as long as the
            // object they were read from, which the callers below keep alive while reading.
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned()
        }
    };
    // SAFETY: `rk` is a live client while `client` is borrowed. Every handle made here is
    // owned by a NativePtr and released once. The C strings in `requested` outlive the calls
    // that read them (librdkafka copies names and values into the resource, and the resources
    // into the request). The result's resources belong to `event` and are read before it is
    // released.
    unsafe {
        let mut resources = Vec::with_capacity(requested.len());
        for (name, configs) in &requested {
            let resource = NativePtr::from_ptr(rdsys::rd_kafka_ConfigResource_new(
                rdsys::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TOPIC,
                name.as_ptr(),
            ))
            .ok_or_else(|| AdminFailure::reason("librdkafka made no config resource"))?;
            for (key, value) in configs {
                let error = rdsys::rd_kafka_ConfigResource_add_incremental_config(
                    resource.ptr(),
                    key.as_ptr(),
                    rdsys::rd_kafka_AlterConfigOpType_t::RD_KAFKA_ALTER_CONFIG_OP_TYPE_SET,
                    value.as_ptr(),
                );
                if !error.is_null() {
                    let failure = AdminFailure {
                        code: Some(RDKafkaErrorCode::from(rdsys::rd_kafka_error_code(error))),
                        reason: text(rdsys::rd_kafka_error_string(error)),
                    };
                    rdsys::rd_kafka_error_destroy(error);
                    return Err(failure);
                }
            }
            resources.push(resource);
        }
        let queue = NativePtr::from_ptr(rdsys::rd_kafka_queue_new(rk))
            .ok_or_else(|| AdminFailure::reason("librdkafka made no queue"))?;
        let options = NativePtr::from_ptr(rdsys::rd_kafka_AdminOptions_new(
            rk,
            rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_INCREMENTALALTERCONFIGS,
        ))
        .ok_or_else(|| AdminFailure::reason("librdkafka made no admin options"))?;
        let mut errstr = [0 as std::ffi::c_char; 256];
        let code = rdsys::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr(),
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        if code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(AdminFailure::reason(text(errstr.as_ptr())));
        }
        let mut pointers: Vec<*mut rdsys::rd_kafka_ConfigResource_t> =
            resources.iter().map(NativePtr::ptr).collect();
        rdsys::rd_kafka_IncrementalAlterConfigs(
            rk,
            pointers.as_mut_ptr(),
            pointers.len(),
            options.ptr(),
            queue.ptr(),
        );
        // The request's own timeout answers first; the margin only guards against a lost
        // reply.
        let event = NativePtr::from_ptr(rdsys::rd_kafka_queue_poll(
            queue.ptr(),
            timeout_ms.saturating_add(1000),
        ))
        .ok_or_else(|| {
            AdminFailure::reason(format!(
                "no answer to IncrementalAlterConfigs within {timeout:?}"
            ))
        })?;
        let code = rdsys::rd_kafka_event_error(event.ptr());
        if code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let reason = text(rdsys::rd_kafka_event_error_string(event.ptr()));
            return Err(AdminFailure {
                code: Some(RDKafkaErrorCode::from(code)),
                reason: if reason.is_empty() {
                    "IncrementalAlterConfigs failed".to_owned()
                } else {
                    reason
                },
            });
        }
        let result = rdsys::rd_kafka_event_IncrementalAlterConfigs_result(event.ptr());
        if result.is_null() {
            return Err(AdminFailure::reason(
                "IncrementalAlterConfigs returned no result",
            ));
        }
        let mut count = 0usize;
        let answered = rdsys::rd_kafka_IncrementalAlterConfigs_result_resources(result, &mut count);
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let resource = *answered.add(i);
            let topic = text(rdsys::rd_kafka_ConfigResource_name(resource));
            let code = rdsys::rd_kafka_ConfigResource_error(resource);
            let error =
                (code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| {
                    let code = RDKafkaErrorCode::from(code);
                    let message = text(rdsys::rd_kafka_ConfigResource_error_string(resource));
                    (
                        code,
                        if message.is_empty() {
                            code.to_string()
                        } else {
                            message
                        },
                    )
                });
            out.push((topic, error));
        }
        drop(event);
        drop(options);
        drop(queue);
        drop(resources);
        Ok(out)
    }
}

/// How an ACL's resource name matches topic names (Kafka's `PatternType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AclPattern {
    Literal,
    Prefixed,
}

/// An operation of a topic ACL, as Kafka names it (`READ`, `WRITE`, `ALL`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AclOperation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    DescribeConfigs,
    AlterConfigs,
    /// One this client does not know (a newer Kafka's, or CLUSTER_ACTION/IDEMPOTENT_WRITE,
    /// which a topic ACL never holds).
    Other,
}

impl AclOperation {
    const PAIRS: [(AclOperation, rdsys::rd_kafka_AclOperation_t); 9] = {
        use rdsys::rd_kafka_AclOperation_t as O;
        [
            (AclOperation::All, O::RD_KAFKA_ACL_OPERATION_ALL),
            (AclOperation::Read, O::RD_KAFKA_ACL_OPERATION_READ),
            (AclOperation::Write, O::RD_KAFKA_ACL_OPERATION_WRITE),
            (AclOperation::Create, O::RD_KAFKA_ACL_OPERATION_CREATE),
            (AclOperation::Delete, O::RD_KAFKA_ACL_OPERATION_DELETE),
            (AclOperation::Alter, O::RD_KAFKA_ACL_OPERATION_ALTER),
            (AclOperation::Describe, O::RD_KAFKA_ACL_OPERATION_DESCRIBE),
            (
                AclOperation::DescribeConfigs,
                O::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
            ),
            (
                AclOperation::AlterConfigs,
                O::RD_KAFKA_ACL_OPERATION_ALTER_CONFIGS,
            ),
        ]
    };

    fn native(self) -> Option<rdsys::rd_kafka_AclOperation_t> {
        Self::PAIRS
            .iter()
            .find(|(o, _)| *o == self)
            .map(|(_, n)| *n)
    }

    fn from_native(op: rdsys::rd_kafka_AclOperation_t) -> AclOperation {
        Self::PAIRS
            .iter()
            .find(|(_, n)| *n == op)
            .map_or(AclOperation::Other, |(o, _)| *o)
    }

    /// Kafka's name: `READ`, `DESCRIBE_CONFIGS`, ...
    pub fn name(self) -> &'static str {
        match self {
            AclOperation::All => "ALL",
            AclOperation::Read => "READ",
            AclOperation::Write => "WRITE",
            AclOperation::Create => "CREATE",
            AclOperation::Delete => "DELETE",
            AclOperation::Alter => "ALTER",
            AclOperation::Describe => "DESCRIBE",
            AclOperation::DescribeConfigs => "DESCRIBE_CONFIGS",
            AclOperation::AlterConfigs => "ALTER_CONFIGS",
            AclOperation::Other => "UNKNOWN",
        }
    }

    /// The operation Kafka names `name`, if this client knows it.
    pub fn parse(name: &str) -> Option<AclOperation> {
        Self::PAIRS
            .iter()
            .map(|(o, _)| *o)
            .find(|o| o.name() == name)
    }
}

/// Whether an ACL grants (ALLOW) or refuses (DENY); a DENY wins over every ALLOW.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AclPermission {
    Allow,
    Deny,
}

impl AclPermission {
    /// As Kafka names it.
    pub fn name(self) -> &'static str {
        match self {
            AclPermission::Allow => "ALLOW",
            AclPermission::Deny => "DENY",
        }
    }

    fn native(self) -> rdsys::rd_kafka_AclPermissionType_t {
        match self {
            AclPermission::Allow => {
                rdsys::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW
            }
            AclPermission::Deny => {
                rdsys::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_DENY
            }
        }
    }

    fn from_native(native: rdsys::rd_kafka_AclPermissionType_t) -> Option<AclPermission> {
        match native {
            rdsys::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW => {
                Some(AclPermission::Allow)
            }
            rdsys::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_DENY => {
                Some(AclPermission::Deny)
            }
            _ => None,
        }
    }
}

/// One ACL on a topic resource: whether (`permission`) who (`principal`, `host`) may do
/// `operation` on the topics `name` names (`pattern`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicAcl {
    pub pattern: AclPattern,
    pub name: String,
    pub principal: String,
    pub host: String,
    pub operation: AclOperation,
    pub permission: AclPermission,
}

/// An ACL request's per-binding answer: `None` if applied, else the error code and message.
pub type AclAnswer = Option<(RDKafkaErrorCode, String)>;

/// Reads a librdkafka string: empty for NULL.
///
/// # Safety
/// A non-null `ptr` is a NUL-terminated string alive for the call.
unsafe fn c_text(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's contract.
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()
    }
}

/// An `rd_kafka_error_t` as an answer (`None` for NULL or NO_ERROR); not released (the
/// error belongs to the result it was read from).
///
/// # Safety
/// A non-null `error` is alive for the call.
unsafe fn error_answer(error: *const rdsys::rd_kafka_error_t) -> AclAnswer {
    if error.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    unsafe {
        let code = rdsys::rd_kafka_error_code(error);
        (code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| {
            let code = RDKafkaErrorCode::from(code);
            let message = c_text(rdsys::rd_kafka_error_string(error));
            (
                code,
                if message.is_empty() {
                    code.to_string()
                } else {
                    message
                },
            )
        })
    }
}

/// What a binding or filter is made of: C strings alive until the request is sent.
struct AclStrings {
    name: Option<CString>,
    principal: Option<CString>,
    host: Option<CString>,
}

impl AclStrings {
    fn of(acl: &TopicAcl) -> Result<AclStrings, AdminFailure> {
        let c = |s: &str| {
            CString::new(s).map_err(|_| AdminFailure::reason(format!("{s:?} holds a NUL byte")))
        };
        Ok(AclStrings {
            name: Some(c(&acl.name)?),
            principal: Some(c(&acl.principal)?),
            host: Some(c(&acl.host)?),
        })
    }

    fn ptr(s: &Option<CString>) -> *const std::ffi::c_char {
        s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())
    }
}

/// The request's binding (`filter` false) or exact filter (`filter` true) for `acl`.
///
/// # Safety
/// Only librdkafka's constructors are called; the strings are copied by them.
unsafe fn native_binding(
    acl: &TopicAcl,
    strings: &AclStrings,
    filter: bool,
) -> Result<NativePtr<rdsys::rd_kafka_AclBinding_t>, AdminFailure> {
    let pattern = match acl.pattern {
        AclPattern::Literal => {
            rdsys::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_LITERAL
        }
        AclPattern::Prefixed => {
            rdsys::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_PREFIXED
        }
    };
    let operation = acl.operation.native().ok_or_else(|| {
        AdminFailure::reason(format!(
            "ACL operation {} is not one librdkafka makes",
            acl.operation.name()
        ))
    })?;
    let mut errstr = [0 as std::ffi::c_char; 256];
    let args = (
        rdsys::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TOPIC,
        AclStrings::ptr(&strings.name),
        pattern,
        AclStrings::ptr(&strings.principal),
        AclStrings::ptr(&strings.host),
        operation,
        acl.permission.native(),
    );
    // SAFETY: the strings are NUL-terminated and alive for the call (librdkafka copies them);
    // `errstr` is writable for its length.
    let made = unsafe {
        if filter {
            rdsys::rd_kafka_AclBindingFilter_new(
                args.0,
                args.1,
                args.2,
                args.3,
                args.4,
                args.5,
                args.6,
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        } else {
            rdsys::rd_kafka_AclBinding_new(
                args.0,
                args.1,
                args.2,
                args.3,
                args.4,
                args.5,
                args.6,
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        }
    };
    // SAFETY: a non-null binding is ours to release; `errstr` is NUL-terminated.
    unsafe { NativePtr::from_ptr(made) }
        .ok_or_else(|| AdminFailure::reason(unsafe { c_text(errstr.as_ptr()) }))
}

/// The admin options of `op` with the request timeout, and a queue for its answer.
///
/// # Safety
/// `rk` is a live client.
unsafe fn request(
    rk: *mut rdsys::rd_kafka_t,
    op: rdsys::rd_kafka_admin_op_t,
    timeout_ms: i32,
) -> Result<
    (
        NativePtr<rdsys::rd_kafka_queue_t>,
        NativePtr<rdsys::rd_kafka_AdminOptions_t>,
    ),
    AdminFailure,
> {
    // SAFETY: `rk` is live (the caller's contract); both handles are owned by NativePtrs.
    unsafe {
        let queue = NativePtr::from_ptr(rdsys::rd_kafka_queue_new(rk))
            .ok_or_else(|| AdminFailure::reason("librdkafka made no queue"))?;
        let options = NativePtr::from_ptr(rdsys::rd_kafka_AdminOptions_new(rk, op))
            .ok_or_else(|| AdminFailure::reason("librdkafka made no admin options"))?;
        let mut errstr = [0 as std::ffi::c_char; 256];
        let code = rdsys::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr(),
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        if code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(AdminFailure::reason(c_text(errstr.as_ptr())));
        }
        Ok((queue, options))
    }
}

/// Waits for the answer on `queue`: the event, or the request's failure as a whole.
///
/// # Safety
/// `queue` is a live queue an admin request answers on.
unsafe fn answer(
    queue: &NativePtr<rdsys::rd_kafka_queue_t>,
    what: &str,
    timeout: Duration,
) -> Result<NativePtr<rdsys::rd_kafka_event_t>, AdminFailure> {
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: the caller's contract; the event is owned by a NativePtr, its error string read
    // while it lives.
    unsafe {
        // The request's own timeout answers first; the margin only guards against a lost
        // reply.
        let event = NativePtr::from_ptr(rdsys::rd_kafka_queue_poll(
            queue.ptr(),
            timeout_ms.saturating_add(1000),
        ))
        .ok_or_else(|| AdminFailure::reason(format!("no answer to {what} within {timeout:?}")))?;
        let code = rdsys::rd_kafka_event_error(event.ptr());
        if code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let reason = c_text(rdsys::rd_kafka_event_error_string(event.ptr()));
            return Err(AdminFailure {
                code: Some(RDKafkaErrorCode::from(code)),
                reason: if reason.is_empty() {
                    format!("{what} failed")
                } else {
                    reason
                },
            });
        }
        Ok(event)
    }
}

/// DescribeAcls (KIP-140) with a filter of every ACL on TOPIC resources, ALLOW and DENY,
/// LITERAL and PREFIXED (any name, principal, host and operation). Needs DESCRIBE on the
/// cluster.
pub fn describe_topic_acls<C: ClientContext>(
    client: &Client<C>,
    timeout: Duration,
) -> Result<Vec<TopicAcl>, AdminFailure> {
    let rk = client.native_ptr();
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `rk` is a live client while `client` is borrowed. Every handle made here is
    // owned by a NativePtr and released once (librdkafka copies the filter into the request).
    // The result's bindings belong to `event` and are read before it is released.
    unsafe {
        let (queue, options) = request(
            rk,
            rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBEACLS,
            timeout_ms,
        )?;
        let mut errstr = [0 as std::ffi::c_char; 256];
        let filter = NativePtr::from_ptr(rdsys::rd_kafka_AclBindingFilter_new(
            rdsys::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TOPIC,
            std::ptr::null(),
            rdsys::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_ANY,
            std::ptr::null(),
            std::ptr::null(),
            rdsys::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_ANY,
            rdsys::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ANY,
            errstr.as_mut_ptr(),
            errstr.len(),
        ))
        .ok_or_else(|| AdminFailure::reason(c_text(errstr.as_ptr())))?;
        rdsys::rd_kafka_DescribeAcls(rk, filter.ptr(), options.ptr(), queue.ptr());
        let event = answer(&queue, "DescribeAcls", timeout)?;
        let result = rdsys::rd_kafka_event_DescribeAcls_result(event.ptr());
        if result.is_null() {
            return Err(AdminFailure::reason("DescribeAcls returned no result"));
        }
        let mut count = 0usize;
        let acls = rdsys::rd_kafka_DescribeAcls_result_acls(result, &mut count);
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let acl = *acls.add(i);
            let pattern = match rdsys::rd_kafka_AclBinding_resource_pattern_type(acl) {
                rdsys::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_LITERAL => {
                    AclPattern::Literal
                }
                rdsys::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_PREFIXED => {
                    AclPattern::Prefixed
                }
                _ => continue,
            };
            let Some(permission) =
                AclPermission::from_native(rdsys::rd_kafka_AclBinding_permission_type(acl))
            else {
                continue;
            };
            out.push(TopicAcl {
                pattern,
                name: c_text(rdsys::rd_kafka_AclBinding_name(acl)),
                principal: c_text(rdsys::rd_kafka_AclBinding_principal(acl)),
                host: c_text(rdsys::rd_kafka_AclBinding_host(acl)),
                operation: AclOperation::from_native(rdsys::rd_kafka_AclBinding_operation(acl)),
                permission,
            });
        }
        drop(event);
        drop(filter);
        drop(options);
        drop(queue);
        Ok(out)
    }
}

/// CreateAcls (KIP-140): each of `acls` as a binding; one answer per binding, in the order
/// given. Needs ALTER on the cluster.
pub fn create_topic_acls<C: ClientContext>(
    client: &Client<C>,
    acls: &[TopicAcl],
    timeout: Duration,
) -> Result<Vec<AclAnswer>, AdminFailure> {
    if acls.is_empty() {
        return Ok(Vec::new());
    }
    let strings: Vec<AclStrings> = acls.iter().map(AclStrings::of).collect::<Result<_, _>>()?;
    let rk = client.native_ptr();
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `rk` is a live client while `client` is borrowed. Every handle made here is
    // owned by a NativePtr and released once (librdkafka copies the bindings into the
    // request). The result's entries belong to `event` and are read before it is released.
    unsafe {
        let bindings = acls
            .iter()
            .zip(&strings)
            .map(|(acl, s)| native_binding(acl, s, false))
            .collect::<Result<Vec<_>, _>>()?;
        let (queue, options) = request(
            rk,
            rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_CREATEACLS,
            timeout_ms,
        )?;
        let mut pointers: Vec<*mut rdsys::rd_kafka_AclBinding_t> =
            bindings.iter().map(NativePtr::ptr).collect();
        rdsys::rd_kafka_CreateAcls(
            rk,
            pointers.as_mut_ptr(),
            pointers.len(),
            options.ptr(),
            queue.ptr(),
        );
        let event = answer(&queue, "CreateAcls", timeout)?;
        let result = rdsys::rd_kafka_event_CreateAcls_result(event.ptr());
        if result.is_null() {
            return Err(AdminFailure::reason("CreateAcls returned no result"));
        }
        let mut count = 0usize;
        let answers = rdsys::rd_kafka_CreateAcls_result_acls(result, &mut count);
        let out = (0..count)
            .map(|i| error_answer(rdsys::rd_kafka_acl_result_error(*answers.add(i))))
            .collect();
        drop(event);
        drop(options);
        drop(queue);
        drop(bindings);
        Ok(out)
    }
}

/// DeleteAcls (KIP-140) with one exact filter per ACL (its pattern, name, principal, host and
/// operation, permission): nothing but that binding matches. One answer per filter, in the order
/// given. Needs ALTER on the cluster.
pub fn delete_topic_acls<C: ClientContext>(
    client: &Client<C>,
    acls: &[TopicAcl],
    timeout: Duration,
) -> Result<Vec<AclAnswer>, AdminFailure> {
    if acls.is_empty() {
        return Ok(Vec::new());
    }
    let strings: Vec<AclStrings> = acls.iter().map(AclStrings::of).collect::<Result<_, _>>()?;
    let rk = client.native_ptr();
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: as in `create_topic_acls`; each response's error belongs to `event`.
    unsafe {
        let filters = acls
            .iter()
            .zip(&strings)
            .map(|(acl, s)| native_binding(acl, s, true))
            .collect::<Result<Vec<_>, _>>()?;
        let (queue, options) = request(
            rk,
            rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DELETEACLS,
            timeout_ms,
        )?;
        let mut pointers: Vec<*mut rdsys::rd_kafka_AclBinding_t> =
            filters.iter().map(NativePtr::ptr).collect();
        rdsys::rd_kafka_DeleteAcls(
            rk,
            pointers.as_mut_ptr(),
            pointers.len(),
            options.ptr(),
            queue.ptr(),
        );
        let event = answer(&queue, "DeleteAcls", timeout)?;
        let result = rdsys::rd_kafka_event_DeleteAcls_result(event.ptr());
        if result.is_null() {
            return Err(AdminFailure::reason("DeleteAcls returned no result"));
        }
        let mut count = 0usize;
        let responses = rdsys::rd_kafka_DeleteAcls_result_responses(result, &mut count);
        let out = (0..count)
            .map(|i| {
                error_answer(rdsys::rd_kafka_DeleteAcls_result_response_error(
                    *responses.add(i),
                ))
            })
            .collect();
        drop(event);
        drop(options);
        drop(queue);
        drop(filters);
        Ok(out)
    }
}
