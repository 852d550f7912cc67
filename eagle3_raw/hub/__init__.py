"""Publish a recipe's set on the Hugging Face Hub, and rebuild a published set to compare.

:func:`push`, in this order (each step only once the ones before it succeeded):

1. credentials (``token``, else ``HF_TOKEN`` or the ``huggingface_hub`` login): none is a HubError
   before anything is built;
2. the repo: created if missing, then write access checked by creating and deleting a throwaway
   branch (an existing repo the token cannot write is a HubError naming it, before any generation;
   ``create_repo(exist_ok=True)`` alone passes for any readable repo), the ``revision`` branch
   created from ``main`` if missing, the ``tag`` checked to be free;
3. the set, built or reused from the ``datasets`` cache (a second push sends no request);
4. the data: ``Dataset.push_to_hub(repo_id, config_name=recipe.name, split="train")``;
5. one commit with ``recipes/<name>.yaml`` (the resolved recipe, secrets scrubbed, a local prompt
   source uploaded beside it under ``recipes/<name>/prompts/`` and pointed at relatively, which
   keeps the fingerprint: checked before anything is uploaded), ``recipes/<name>.manifest.json``
   (:func:`build_manifest`), ``recipes/<name>.lengths.svg`` and the draft-vocabulary files under
   ``recipes/<name>/vocab/`` (:mod:`eagle3_raw.export.published`);
6. the card: the README that step 4 wrote, merged (:mod:`eagle3_raw.card`);
7. the tag, on the card's commit. An existing tag is never moved.

:func:`reproduce` downloads ``recipes/<config>.yaml`` (and its files) at one commit, rebuilds it in
a fresh cache and journal, loads the published rows at the same commit, and compares them by row id
(:func:`compare`).

Secrets: the Hub token goes only into ``Authorization`` headers; nothing is logged with it. Every
text uploaded (recipe, manifest, card, picture, prompt files) is checked not to contain it nor the
server API key, and server facts pass through :func:`scrub` (keys named like secrets dropped,
secret command-line flags and URL credentials redacted).

The package, by concern: :mod:`.client` (credentials, the Hub client, Hub errors as HubError),
:mod:`.sets` (building the set, reading it in Arrow batches), :mod:`.published` (the recipe as
published, the credential check), :mod:`.manifest`, :mod:`.pushing` (the steps above),
:mod:`.reproducing` and :mod:`.comparison`. Import from here (each name loads its module on first
use, :mod:`eagle3_raw.lazy`); the modules are the package's own.
"""

from typing import TYPE_CHECKING

from eagle3_raw.lazy import facade

if TYPE_CHECKING:
    from eagle3_raw.builder import Built, build
    from eagle3_raw.hub.client import NO_CREDENTIALS, check_repo_id, hub_errors, parse_repo_ref, resolve_token
    from eagle3_raw.hub.comparison import Comparison, RowDifference, compare, first_differences, row_hashes
    from eagle3_raw.hub.manifest import build_manifest
    from eagle3_raw.hub.published import PublishedRecipe, check_no_secrets, publish_recipe
    from eagle3_raw.hub.pushing import PushResult, prepare_repo, publish, push
    from eagle3_raw.hub.reproducing import choose_config, fetch_recipe, reproduce
    from eagle3_raw.hub.sets import SetScan, scan_set
    from eagle3_raw.redact import is_secret_name, public_url, scrub, scrub_args, scrub_text

_EXPORTS = {
    "Built": "eagle3_raw.builder",
    "Comparison": "comparison",
    "NO_CREDENTIALS": "client",
    "PublishedRecipe": "published",
    "PushResult": "pushing",
    "RowDifference": "comparison",
    "SetScan": "sets",
    "build": "eagle3_raw.builder",
    "build_manifest": "manifest",
    "check_no_secrets": "published",
    "check_repo_id": "client",
    "choose_config": "reproducing",
    "compare": "comparison",
    "fetch_recipe": "reproducing",
    "first_differences": "comparison",
    "hub_errors": "client",
    "is_secret_name": "eagle3_raw.redact",
    "parse_repo_ref": "client",
    "prepare_repo": "pushing",
    "public_url": "eagle3_raw.redact",
    "publish": "pushing",
    "publish_recipe": "published",
    "push": "pushing",
    "reproduce": "reproducing",
    "resolve_token": "client",
    "row_hashes": "comparison",
    "scan_set": "sets",
    "scrub": "eagle3_raw.redact",
    "scrub_args": "eagle3_raw.redact",
    "scrub_text": "eagle3_raw.redact",
}
__getattr__, __dir__ = facade(__name__, _EXPORTS)

__all__ = [
    "NO_CREDENTIALS", "Built", "Comparison", "PublishedRecipe", "PushResult", "RowDifference", "SetScan",
    "build", "build_manifest", "check_no_secrets", "check_repo_id", "choose_config", "compare",
    "fetch_recipe", "first_differences", "hub_errors", "is_secret_name", "parse_repo_ref", "prepare_repo",
    "public_url", "publish", "publish_recipe", "push", "reproduce", "resolve_token", "row_hashes", "scan_set",
    "scrub", "scrub_args", "scrub_text",
]  # fmt: skip
