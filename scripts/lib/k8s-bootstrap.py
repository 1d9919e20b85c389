"""The local Kubernetes cluster's objects that scripts/k8s creates as its admin (run by scripts/k8s).

    setup --portal-kubeconfig FILE --server URL --ca FILE
        the node agent's ClusterRole; the portal's service account (gpuportal-system/gpuportal) with
        only the rights the portal needs; its kubeconfig (its token) written to FILE
    namespace NAME...
        team namespaces (label gpuportal.io/managed=true), each with a RoleBinding that gives the
        portal's service account its namespaced rights there and nowhere else
    nodes-ready [--show]
        exit 0 when every node of the node agent is Ready and schedulable (--show prints them)

Idempotent: every object is created, or replaced when it exists.
"""

import argparse
import base64
import sys
import time
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

PORTAL_NAMESPACE = "gpuportal-system"
PORTAL_SA = "gpuportal"
MANAGED_LABEL = "gpuportal.io/managed"
AGENT_LABEL = "gpuportal.io/emulated-node"

# The portal's rights in a team namespace: its Jobs (create, cancel by delete, watch), their pods
# (state, and delete for a stuck one), pods/log (output), events (the scheduler's pending reason)
# and the ResourceQuota that mirrors the team's GPU cap; deletecollection of jobs: finished Jobs deleted
# in bulk once their usage is recorded.
PORTAL_NAMESPACED_RULES = [
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete", "deletecollection"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": [""],
        "resources": ["resourcequotas"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
]
# Cluster-wide, read only: the nodes (GPU types, capacity, health), which namespaces exist, and the
# sync's one list of the portal's Jobs, of their pods and (when a job waits) of Warning events across
# all namespaces — list and watch only: no get, no pods/log, nothing written outside the teams'
# namespaces (the portal keeps to the managed namespaces' Jobs among what it lists).
PORTAL_CLUSTER_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
]
# The node agent (a kubelet's rights, for the nodes it plays).
AGENT_RULES = [
    {
        "apiGroups": [""],
        "resources": ["nodes"],
        "verbs": ["get", "list", "watch", "create", "update", "patch"],
    },
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "update", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "update", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "update", "patch"],
    },
]


def apply(create, replace, name, body, namespace=None):
    """Create the object, or replace it when it exists (the same body: idempotent)."""
    ns = {"namespace": namespace} if namespace else {}
    try:
        create(body=body, **ns)
    except ApiException as exc:
        if exc.status != 409:
            raise
        if replace is not None:
            replace(name=name, body=body, **ns)


def cluster_role(rbac, name, rules):
    body = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": rules,
    }
    apply(rbac.create_cluster_role, rbac.replace_cluster_role, name, body)


def cluster_role_binding(rbac, name, role, subject):
    body = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [subject],
    }
    apply(rbac.create_cluster_role_binding, rbac.replace_cluster_role_binding, name, body)


def portal_subject():
    return {"kind": "ServiceAccount", "name": PORTAL_SA, "namespace": PORTAL_NAMESPACE}


def namespace_ensure(core, rbac, name):
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {MANAGED_LABEL: "true"}},
    }
    apply(core.create_namespace, None, name, body)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "gpuportal-portal", "namespace": name},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "gpuportal-portal",
        },
        "subjects": [portal_subject()],
    }
    apply(
        rbac.create_namespaced_role_binding,
        rbac.replace_namespaced_role_binding,
        "gpuportal-portal",
        binding,
        name,
    )


def portal_token(core, timeout=60):
    """The service account's token (1.20: the token controller writes it into a Secret)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sa = core.read_namespaced_service_account(PORTAL_SA, PORTAL_NAMESPACE)
        for ref in sa.secrets or []:
            secret = core.read_namespaced_secret(ref.name, PORTAL_NAMESPACE)
            if secret.type == "kubernetes.io/service-account-token" and (secret.data or {}).get("token"):
                return base64.b64decode(secret.data["token"]).decode()
        time.sleep(0.5)
    sys.exit(
        f"no token for the service account {PORTAL_NAMESPACE}/{PORTAL_SA} after {timeout} s (kube-controller-manager?)"
    )


def write_kubeconfig(path, server, ca, token):
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: gpuportal-k8s
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {PORTAL_NAMESPACE}:{PORTAL_SA}
  user:
    token: {token}
contexts:
- name: gpuportal-k8s
  context:
    cluster: gpuportal-k8s
    user: {PORTAL_NAMESPACE}:{PORTAL_SA}
current-context: gpuportal-k8s
"""
    path = Path(path)
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_suffix(".tmp")
    tmp.touch(mode=0o600)
    tmp.write_text(text)
    tmp.replace(path)


def setup(core, rbac, args):
    cluster_role(rbac, "gpuportal-node-agent", AGENT_RULES)
    cluster_role_binding(
        rbac,
        "gpuportal-node-agent",
        "gpuportal-node-agent",
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "gpuportal-node-agent"},
    )
    cluster_role(rbac, "gpuportal-portal", PORTAL_NAMESPACED_RULES)
    cluster_role(rbac, "gpuportal-portal-cluster", PORTAL_CLUSTER_RULES)
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PORTAL_NAMESPACE}}
    apply(core.create_namespace, None, PORTAL_NAMESPACE, body)
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": PORTAL_SA, "namespace": PORTAL_NAMESPACE},
    }
    apply(core.create_namespaced_service_account, None, PORTAL_SA, sa, PORTAL_NAMESPACE)
    cluster_role_binding(rbac, "gpuportal-portal-cluster", "gpuportal-portal-cluster", portal_subject())
    write_kubeconfig(args.portal_kubeconfig, args.server, args.ca, portal_token(core))


def nodes_ready(core, show):
    nodes = core.list_node(label_selector=f"{AGENT_LABEL}=true").items
    ok = bool(nodes)
    for node in nodes:
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        tainted = any(t.key.startswith("node.kubernetes.io/") for t in node.spec.taints or [])
        ok = ok and ready and not tainted
        if show:
            gpus = (node.status.allocatable or {}).get("nvidia.com/gpu", "0")
            product = node.metadata.labels.get("nvidia.com/gpu.product", "?")
            state = "Ready" if ready and not tainted else "NOT READY"
            print(f"  node {node.metadata.name:<16} {state:<10} {gpus} x {product}")
    if show and not nodes:
        print("  no nodes registered (node agent?)")
    return ok


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--admin-kubeconfig", required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("setup")
    p.add_argument("--portal-kubeconfig", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--ca", required=True)
    p = sub.add_parser("namespace")
    p.add_argument("names", nargs="+")
    p = sub.add_parser("nodes-ready")
    p.add_argument("--show", action="store_true")
    args = parser.parse_args()

    api = config.new_client_from_config(config_file=args.admin_kubeconfig)
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    if args.command == "setup":
        setup(core, rbac, args)
    elif args.command == "namespace":
        for name in args.names:
            namespace_ensure(core, rbac, name)
            print(f"namespace {name}: the portal's service account may run Jobs there")
    elif args.command == "nodes-ready":
        sys.exit(0 if nodes_ready(core, args.show) else 3)


if __name__ == "__main__":
    main()
