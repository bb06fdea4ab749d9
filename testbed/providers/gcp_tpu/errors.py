"""Turn google-api-core / google-auth / transport exceptions into one clear ``TestbedError``.

Kept apart from the provider so the mapping can be read (and tested) as a table. Nothing here imports a
Google library at module import: exceptions are recognised by their class names.
"""

from __future__ import annotations

import re

from testbed.errors import TestbedError

ADC_FIX = ("run 'gcloud auth application-default login' (or set GOOGLE_APPLICATION_CREDENTIALS to a service "
           "account key file); credentials are read from Application Default Credentials and never stored")


def _names(e: BaseException) -> set[str]:
    return {c.__name__ for c in type(e).__mro__}


def _message(e: BaseException) -> str:
    msg = " ".join(str(getattr(e, "message", None) or e).split())
    msg = re.sub(r"^(GET|POST|DELETE|PATCH|PUT) \S+: ", "", msg)  # the REST transport prefixes the URL
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", msg)  # urllib3's nested "Caused by" chains
    if "Max retries exceeded" in msg and errno:
        msg = errno.group(0).strip()
    return msg[:400]


def api_error(e: BaseException, *, action: str, where: str, testbed: str, zone: str = "",
              accelerator: str = "") -> TestbedError:
    """``e`` raised while doing ``action`` (``"create node tb-0"``) as one message: what, where, what to do."""
    names = _names(e)
    msg = _message(e)
    cleanup = f"'testbed destroy {testbed}' releases anything already requested"
    if names & {"ResourceExhausted", "TooManyRequests"}:
        return TestbedError(
            f"no TPU capacity or quota for {accelerator or 'this slice'} in {zone or 'the zone'}: {msg}",
            where=where,
            fix=f"retry later, try another zone, set spot: true or queued_resource: true, or ask for quota; {cleanup}")
    if names & {"PermissionDenied", "Forbidden"}:
        if getattr(e, "reason", None) == "SERVICE_DISABLED" or "has not been used in project" in msg:
            return TestbedError(f"the Cloud TPU API is not enabled, so testbed cannot {action}: {msg}", where=where,
                                fix="gcloud services enable tpu.googleapis.com --project <project> (then wait a "
                                    "minute for it to take effect)")
        return TestbedError(
            f"permission denied to {action}: {msg}", where=where,
            fix="enable the API (gcloud services enable tpu.googleapis.com) and grant your ADC account "
                "roles/tpu.admin on the project")
    if names & {"Unauthenticated", "Unauthorized", "RefreshError", "DefaultCredentialsError"}:
        return TestbedError(f"the TPU API refused the credentials to {action}: {msg}", where=where, fix=ADC_FIX)
    if "NotFound" in names:
        return TestbedError(
            f"not found while trying to {action}: {msg}", where=where,
            fix="check provider.project and provider.zone (gcloud compute tpus locations list) and that the "
                "TPU API is enabled in the project")
    if names & {"InvalidArgument", "BadRequest", "FailedPrecondition"} and "requireOsLogin" in msg:
        return TestbedError(
            f"the project enforces OS Login (organization policy constraints/compute.requireOsLogin), so testbed "
            f"cannot {action} with its key in the ssh-keys metadata: {msg}", where=where,
            fix="ask an organization policy administrator to exempt the project from constraints/compute."
                "requireOsLogin (or use a project without it): under OS Login TPU VMs ignore metadata SSH keys")
    if names & {"InvalidArgument", "BadRequest", "FailedPrecondition"} and re.search(r"(?i)\b(sub)?network", msg):
        return TestbedError(
            f"the TPU API rejected the network settings to {action}: {msg}", where=where,
            fix="set provider.network (and provider.subnetwork, in the zone's region) to an existing VPC network: "
                "gcloud compute networks list / networks subnets list (a project may have no 'default' network)")
    if names & {"InvalidArgument", "BadRequest", "FailedPrecondition"}:
        return TestbedError(
            f"the TPU API rejected the request to {action}: {msg}", where=where,
            fix="check accelerator_type and runtime_version for this zone (gcloud compute tpus "
                "accelerator-types list / tpu-vm versions list)")
    if names & {"AlreadyExists", "Conflict"}:
        return TestbedError(f"cannot {action}: it already exists ({msg})", where=where,
                            fix=f"'testbed provision {testbed}' adopts nodes it recorded; else delete it or rename "
                                "the testbed")
    if names & {"DeadlineExceeded", "GatewayTimeout", "RetryError", "TimeoutError", "Timeout"}:
        return TestbedError(f"the TPU API did not answer in time to {action}: {msg}", where=where,
                            fix=f"retry; {cleanup}")
    if names & {"ServerError", "ConnectionError", "TransportError"}:
        return TestbedError(f"the TPU API is unavailable ({action}): {msg}", where=where,
                            fix=f"check the network and provider.endpoint, then retry; {cleanup}")
    if "GoogleAPICallError" in names or "GoogleAPIError" in names:
        return TestbedError(f"the TPU API failed to {action}: {msg}", where=where, fix=f"retry; {cleanup}")
    if "RequestException" in names:
        return TestbedError(f"cannot reach the TPU API to {action}: {msg}", where=where,
                            fix="check the network and provider.endpoint, then retry")
    return TestbedError(f"failed to {action}: {type(e).__name__}: {msg}", where=where, fix=f"retry; {cleanup}")


def is_not_found(e: BaseException) -> bool:
    return "NotFound" in _names(e)


def is_already_exists(e: BaseException) -> bool:
    return bool(_names(e) & {"AlreadyExists", "Conflict"})


def is_refusal(e: BaseException) -> bool:
    """A 4xx answer to a create: the request was refused and nothing was created."""
    n = _names(e)
    return "ClientError" in n and not n & {"AlreadyExists", "Conflict"}


def is_api_error(e: BaseException) -> bool:
    """An exception raised by the client library or its transport (not a bug of ours)."""
    n = _names(e)
    return bool(n & {"GoogleAPIError", "RequestException", "TransportError", "DefaultCredentialsError",
                     "RefreshError"})
