"""A gs:// store location becomes TensorStore's `gcs` kvstore spec, down to every partition
array, without any network access (the kvstore is swapped for an in-memory one)."""

import types

import tensorstore as ts

from atdp_io import AtdpStore, layout
from atdp_io import store as store_module

GCS_ROOT = {"driver": "gcs", "bucket": "bucket", "path": "run/atdp/"}


def test_urls_become_kvstore_specs_and_local_paths_stay_files(tmp_path, monkeypatch):
    assert layout.kvstore_spec("gs://bucket/run/atdp") == GCS_ROOT
    assert layout.kvstore_spec("gs://bucket/run/atdp/") == GCS_ROOT
    monkeypatch.chdir(tmp_path)
    assert layout.kvstore_spec("atdp") == {"driver": "file", "path": f"{tmp_path}/atdp/"}
    partition = layout.child_spec(GCS_ROOT, "tenants", "rollouts")
    records = layout.array_spec(partition, "records", layout.StoreConfig())
    assert records["kvstore"] == {
        "driver": "gcs",
        "bucket": "bucket",
        "path": "run/atdp/tenants/rollouts/records/",
    }


def test_store_opened_on_a_bucket_hands_gcs_specs_to_tensorstore(monkeypatch):
    opened = []

    def open_in_memory(spec, context=None):
        opened.append(dict(spec))
        return ts.KvStore.open({"driver": "memory", "path": spec["path"]}, context=context)

    fake_ts = types.SimpleNamespace(
        KvStore=types.SimpleNamespace(open=open_in_memory), Context=ts.Context
    )
    monkeypatch.setattr(store_module, "ts", fake_ts)
    store = AtdpStore.open("gs://bucket/run/atdp")
    assert opened and all(spec == GCS_ROOT for spec in opened)
    assert store.root == GCS_ROOT
    assert store.partition_spec("rollouts") == {**GCS_ROOT, "path": "run/atdp/tenants/rollouts/"}
