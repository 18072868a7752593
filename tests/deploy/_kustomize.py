"""A small kustomize renderer for the subset deploy/k8s uses, so the manifests can be built and
checked where ``kubectl`` is not installed.

Supported kustomization fields: ``resources`` (files and directories), ``namespace``,
``labels`` (``pairs`` added to every object's ``metadata.labels``; no selectors, no templates),
``images`` (``newName``, ``newTag``, ``digest``), ``patches`` (a file holding a JSON6902 op
list, applied with :mod:`jsonpatch` to every object its ``target`` matches) and
``configMapGenerator`` / ``secretGenerator`` (``files`` and ``literals``, with
``generatorOptions.disableNameSuffixHash: true``). Anything else raises
:class:`UnsupportedKustomization` naming it, so the renderer can never silently disagree with
kustomize; ``tests/deploy/test_k8s.py`` also compares its output with ``kubectl kustomize``
where that is installed.

The steps run in kustomize's order: resources and generators, then patches, namespace,
labels and images.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = frozenset(
    {
        "apiVersion",
        "kind",
        "resources",
        "namespace",
        "labels",
        "images",
        "patches",
        "configMapGenerator",
        "secretGenerator",
        "generatorOptions",
    }
)
# Kinds without a namespace that kustomize's namespace transformer leaves alone (those that
# could appear in a deployment like this one).
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "PriorityClass",
        "StorageClass",
        "PersistentVolume",
        "CustomResourceDefinition",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    }
)

Obj = dict[str, Any]


class UnsupportedKustomization(Exception):
    """A kustomization uses something this renderer does not reproduce."""

    def __init__(self, where: Path, what: str) -> None:
        self.where = where
        self.what = what
        super().__init__(
            f"{where}: {what} is not supported by tests/deploy/_kustomize.py; use only "
            "resources, namespace, labels, images, JSON6902 patches and generators with "
            "disableNameSuffixHash (or extend the renderer and its parity test)"
        )


def kustomization_file(directory: Path) -> Path:
    """The kustomization file of ``directory``."""
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"no kustomization file in {directory}")


def render(directory: Path | str) -> list[Obj]:
    """The objects ``kubectl kustomize directory`` would print (in no particular order)."""
    directory = Path(directory).resolve()
    path = kustomization_file(directory)
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(spec) - SUPPORTED_FIELDS)
    if unknown:
        raise UnsupportedKustomization(path, f"field(s) {', '.join(unknown)}")
    objects: list[Obj] = []
    for entry in spec.get("resources", []):
        objects += _resource(directory, entry, path)
    objects += _generated(directory, spec, path)
    for patch in spec.get("patches", []):
        _patch(directory, patch, objects, path)
    if "namespace" in spec:
        _set_namespace(objects, spec["namespace"])
    for group in spec.get("labels", []):
        _add_labels(group, objects, path)
    for image in spec.get("images", []):
        _set_image(image, objects, path)
    return objects


def _resource(directory: Path, entry: str, where: Path) -> list[Obj]:
    if "://" in entry or entry.startswith("github.com/"):
        raise UnsupportedKustomization(where, f"the remote resource {entry!r}")
    target = (directory / entry).resolve()
    if target.is_dir():
        return render(target)
    return [doc for doc in yaml.safe_load_all(target.read_text()) if doc is not None]


def _generated(directory: Path, spec: Obj, where: Path) -> list[Obj]:
    generators = [("ConfigMap", g) for g in spec.get("configMapGenerator", [])]
    generators += [("Secret", g) for g in spec.get("secretGenerator", [])]
    if not generators:
        return []
    if not (spec.get("generatorOptions") or {}).get("disableNameSuffixHash"):
        raise UnsupportedKustomization(where, "a generator without disableNameSuffixHash")
    out = []
    for kind, generator in generators:
        extra = sorted(set(generator) - {"name", "files", "literals"})
        if extra:
            raise UnsupportedKustomization(where, f"{kind} generator field(s) {', '.join(extra)}")
        data: dict[str, str] = {}
        for literal in generator.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        for item in generator.get("files", []):
            key, sep, file = item.partition("=")
            if not sep:
                key, file = Path(item).name, item
            data[key] = (directory / file).read_text()
        obj: Obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": generator["name"]}}
        if kind == "Secret":
            obj["type"] = "Opaque"
            obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        else:
            obj["data"] = data
        out.append(obj)
    return out


def _matches(obj: Obj, target: Obj) -> bool:
    meta = obj.get("metadata", {})
    group, _, version = obj.get("apiVersion", "").rpartition("/")
    checks = {
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "group": group,
        "version": version,
    }
    return all(checks[field] == value for field, value in target.items())


def _patch(directory: Path, patch: Obj, objects: list[Obj], where: Path) -> None:
    if set(patch) != {"path", "target"}:
        raise UnsupportedKustomization(where, f"a patch with fields {sorted(patch)}")
    target = patch["target"]
    extra = sorted(set(target) - {"kind", "name", "namespace", "group", "version"})
    if extra:
        raise UnsupportedKustomization(where, f"patch target field(s) {', '.join(extra)}")
    ops = yaml.safe_load((directory / patch["path"]).read_text())
    if not isinstance(ops, list):
        raise UnsupportedKustomization(where, f"the strategic-merge patch {patch['path']}")
    json_patch = jsonpatch.JsonPatch(ops)
    matched = False
    for i, obj in enumerate(objects):
        if _matches(obj, target):
            objects[i] = json_patch.apply(obj)
            matched = True
    if not matched:
        raise ValueError(f"{where}: patch {patch['path']} matches no object ({target})")


def _set_namespace(objects: list[Obj], namespace: str) -> None:
    accounts = {
        obj["metadata"]["name"]: obj["metadata"].get("namespace")
        for obj in objects
        if obj.get("kind") == "ServiceAccount"
    }
    for obj in objects:
        if obj.get("kind") not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
        if obj.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
            for subject in obj.get("subjects", []):
                if subject.get("kind") != "ServiceAccount" or subject["name"] not in accounts:
                    continue
                if subject.get("namespace") in (None, "", "default", accounts[subject["name"]]):
                    subject["namespace"] = namespace


def _add_labels(group: Obj, objects: list[Obj], where: Path) -> None:
    if set(group) - {"pairs"}:
        raise UnsupportedKustomization(where, "labels with includeSelectors/includeTemplates")
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(group["pairs"])


def _containers(obj: Obj) -> list[Obj]:
    spec = obj.get("spec", {})
    if obj.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) if obj.get("kind") != "Pod" else spec
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def _set_image(image: Obj, objects: list[Obj], where: Path) -> None:
    extra = sorted(set(image) - {"name", "newName", "newTag", "digest"})
    if extra:
        raise UnsupportedKustomization(where, f"image field(s) {', '.join(extra)}")
    for obj in objects:
        for container in _containers(obj):
            name, tag = split_image(container["image"])
            if name != image["name"]:
                continue
            name = image.get("newName", name)
            if "digest" in image:
                container["image"] = f"{name}@{image['digest']}"
            elif "newTag" in image:
                container["image"] = f"{name}:{image['newTag']}"
            else:
                container["image"] = f"{name}{tag}"


def split_image(reference: str) -> tuple[str, str]:
    """``(name, suffix)`` of an image reference: ``nats:2.11`` is ``("nats", ":2.11")``."""
    if "@" in reference:
        name, _, digest = reference.partition("@")
        return name, f"@{digest}"
    slash = reference.rfind("/")
    colon = reference.rfind(":")
    if colon > slash:
        return reference[:colon], reference[colon:]
    return reference, ""


def canonical(objects: list[Obj]) -> dict[tuple[str, str, str, str], Obj]:
    """The objects keyed by (apiVersion, kind, namespace, name), deep-copied."""
    out = {}
    for obj in objects:
        meta = obj.get("metadata", {})
        key = (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        if key in out:
            raise ValueError(f"two objects named {key}")
        out[key] = copy.deepcopy(obj)
    return out


__all__ = ["UnsupportedKustomization", "canonical", "kustomization_file", "render", "split_image"]
