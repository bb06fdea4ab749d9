"""``testbed check gcp-tpu``: whether this provider can be used from here (see :mod:`testbed.providers.usable`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast

from testbed.errors import TestbedError
from testbed.providers.base import _quiet
from testbed.providers.gcp_tpu.cloud import ANONYMOUS_ENV, Cloud
from testbed.providers.gcp_tpu.errors import api_error, is_api_error
from testbed.providers.gcp_tpu.settings import TpuSettings
from testbed.providers.gcp_tpu.wait import Polling
from testbed.providers.usable import HTTP_TIMEOUT, Report, extra_installed
from testbed.spec import TestbedSpec
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec
    from testbed.state import Store


def _adc_source(creds: Any) -> str:
    """Where Application Default Credentials came from (google.auth.default's search order)."""
    key = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key:
        return f"GOOGLE_APPLICATION_CREDENTIALS ({key})"
    try:
        from google.auth import _cloud_sdk

        well_known = _cloud_sdk.get_application_default_credentials_path()
    except Exception:  # a google-auth without it
        well_known = ""
    if well_known and os.path.isfile(well_known):
        return f"gcloud auth application-default login ({well_known})"
    if "compute_engine" in type(creds).__module__:
        return "the metadata server (this VM's service account)"
    return type(creds).__name__


def check(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    if spec is None:
        spec = TestbedSpec(name="gcp-tpu", provider=TpuSettings())
    p = Cloud(spec, cast("Store", None), _quiet, Polling())  # the checks read no state and write none
    s = p.settings
    rep.context.update({"zone": s.zone, "accelerator": s.accelerator_type,
                        **({"endpoint": s.endpoint} if s.endpoint else {})})
    extra = extra_installed(rep)
    if not extra:
        rep.add("credentials", None, "not checked: google-auth comes with the extra")
        return
    try:
        p.validate()
        creds, adc_project = p.credentials()
    except TestbedError as e:
        rep.failure("credentials", e)
        return
    anonymous = os.environ.get(ANONYMOUS_ENV) == "1"
    who = getattr(creds, "service_account_email", None)
    rep.add("credentials", True, f"anonymous ({ANONYMOUS_ENV}=1, endpoint {s.endpoint})" if anonymous else
            f"Application Default Credentials from {_adc_source(creds)}" + (f" ({who})" if who else ""))
    try:
        project, where = p.project(adc_project)
    except TestbedError as e:
        rep.failure("project", e)
        return
    rep.add("project", True, f"{project} (from {where})")
    rep.context["project"] = project
    try:
        c = p.client()
        nodes = list(c.list_nodes(parent=p.parent, timeout=HTTP_TIMEOUT, retry=None))
    except Exception as e:
        if not is_api_error(e):
            raise
        err = api_error(e, action="list TPU nodes", where=p.parent + (f" via {s.endpoint}" if s.endpoint else ""),
                        testbed=spec.name, zone=s.zone, accelerator=s.accelerator_type)
        rep.failure("accepted", err)
        return
    ours = sum(1 for n in nodes if dict(n.labels).get("managed-by") == "testbed")
    rep.add("accepted", True, f"the TPU API listed {plural(len(nodes), 'node')} in {p.parent} ({ours} made by testbed)")
    if quotas:
        rep.add("quotas", None, "not given by the TPU API: see IAM & Admin > Quotas in the console (service "
                "tpu.googleapis.com)", required=False)
