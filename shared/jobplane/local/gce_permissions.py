"""What Compute Engine checks for each API call the adapter (jobplane.clouds.gcp) makes: the permission a call needs,
and what a create request needs on top for each field it sets. The Compute fake holds the functions' token to
these (jobplane.local.module_iam's grants); tests/gcp/test_terraform.py checks the module's custom roles hold
exactly them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jobplane.local.module_iam import FunctionGrants

# Each call, by the fake's name for it -> the permissions GCE checks for it
CALL_PERMISSIONS: dict[str, frozenset[str]] = {
    "insert": frozenset({"compute.instances.create"}),
    "bulkInsert": frozenset({"compute.instances.create"}),
    "regionBulkInsert": frozenset({"compute.instances.create"}),
    "waitOperation": frozenset({"compute.zoneOperations.get", "compute.regionOperations.get"}),  # zonal, regional
    "aggregatedList": frozenset({"compute.instances.list"}),
    "get": frozenset({"compute.instances.get"}),
    "delete": frozenset({"compute.instances.delete"}),
    "aggregatedOperations": frozenset({"compute.globalOperations.list"}),
    "getSerialPortOutput": frozenset({"compute.instances.getSerialPortOutput"}),
}
OPERATION_PERMISSION = {"zones": "compute.zoneOperations.get", "regions": "compute.regionOperations.get"}  # by scope
# What a create request sets, field by field -> what GCE checks on top of compute.instances.create
VM_FIELDS: dict[str, frozenset[str]] = {
    "name": frozenset(), "machineType": frozenset(), "scheduling": frozenset(),
    "labels": frozenset({"compute.instances.setLabels"}),
    "metadata": frozenset({"compute.instances.setMetadata"}),
    "serviceAccounts": frozenset({"compute.instances.setServiceAccount"}),
    "disks": frozenset({"compute.disks.create"}),  # a new boot disk (initializeParams), no existing disk attached
    "networkInterfaces": frozenset(),
}
DISK_FIELDS: dict[str, frozenset[str]] = {"boot": frozenset(), "autoDelete": frozenset(),
                                          "initializeParams": frozenset()}
NEW_DISK_FIELDS: dict[str, frozenset[str]] = {
    "diskSizeGb": frozenset(), "diskType": frozenset(), "labels": frozenset({"compute.disks.setLabels"}),
    "sourceImage": frozenset({"compute.images.useReadOnly"})}
NIC_FIELDS: dict[str, frozenset[str]] = {"network": frozenset(),  # no accessConfigs: no external IP
                                         "subnetwork": frozenset({"compute.subnetworks.use"})}
# What changes, deletes or reads the console of an existing VM: granted on the deployment's VMs only
CHANGES_A_VM = frozenset({"compute.instances.delete", "compute.instances.setLabels", "compute.instances.setMetadata",
                          "compute.instances.setServiceAccount", "compute.instances.getSerialPortOutput"})
ACT_AS = "iam.serviceAccounts.actAs"  # attaching a service account to a VM, checked on that account


def _fields(found: Mapping[str, Any], table: Mapping[str, frozenset[str]]) -> set[str]:
    return set().union(*(table[name] for name in found if name in table))


def create_permissions(vm: Mapping[str, Any]) -> set[str]:
    """What creating this VM (a request body, or a bulk request's properties) needs beyond the call's own."""
    needed = _fields(vm, VM_FIELDS)
    for disk in vm.get("disks", ()):
        needed |= _fields(disk, DISK_FIELDS) | _fields(disk.get("initializeParams", {}), NEW_DISK_FIELDS)
    for nic in vm.get("networkInterfaces", ()):
        needed |= _fields(nic, NIC_FIELDS)
    return needed


def service_accounts(vm: Mapping[str, Any]) -> Iterable[str]:
    """The service accounts a create request attaches (each needs ACT_AS on it)."""
    return (str(account.get("email", "")) for account in vm.get("serviceAccounts", ()))


def denied(grants: FunctionGrants, name_prefix: str, vm_account: str, call: str, where: str,
           names: Iterable[str | None] = (None,), bodies: Iterable[Mapping[str, Any]] = ()) -> tuple[str, str] | None:
    """The first permission GCE would refuse the functions for this call, and the resource it names; None if the
    grants allow all of it. where: `zones/Z`, `regions/R` or `global`; names: the instances it is on (None: the
    call is on no one instance); bodies: the VMs a create request asks for."""

    def allows(permission: str, name: str | None) -> bool:
        # functions_own_vms' condition: off instances it holds; on one, only a name with the deployment's prefix
        return permission in grants.compute or (permission in grants.own_vms and
                                                (name is None or name.startswith(name_prefix)))

    bodies = list(bodies)
    scope = where.split("/", 1)[0]
    operation = call in ("getOperation", "waitOperation")  # one of the two, by the operation's scope
    needed = {OPERATION_PERMISSION[scope]} if operation else set(CALL_PERMISSIONS[call])
    for vm in bodies:
        created = str(vm.get("name", ""))
        for permission in sorted(needed | create_permissions(vm)):
            if not allows(permission, created):
                return permission, f"{where}/instances/{created}"
        for account in service_accounts(vm):
            if not (grants.act_as_vms and account == vm_account):
                return ACT_AS, f"serviceAccounts/{account}"
    if not bodies:
        for name in names:
            for permission in sorted(needed):
                if not allows(permission, name):
                    return permission, f"{where}/instances/{name}" if name else where
    return None
