"""How the Flower server and nodes put tensors into messages: bit-exact round trips, and few
objects per message (a deployment moves each object in its own request per hop)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from lightning_fedcluster.flower import records


def mixed_tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "weights": torch.randn(3, 5, generator=generator),
        "double": torch.randn(4, generator=generator, dtype=torch.float64),
        "half": torch.randn(2, 2, generator=generator).to(torch.bfloat16),
        "ids": torch.tensor([7, 1, 3]),
        "active": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).T,  # not contiguous
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(a[name], b[name]), name


def test_encode_and_decode_keep_every_dtype_shape_and_bit():
    tensors = mixed_tensors()
    decoded = records.decode(records.encode({"a": tensors, "b": {"x": torch.tensor([1.0])}}))
    assert_same(decoded["a"], tensors)
    assert decoded["b"]["x"].tolist() == [1.0]
    nan = torch.tensor([float("nan"), -0.0])
    back = records.decode(records.encode({"": {"n": nan}}))[""]["n"]
    assert back.isnan()[0] and torch.equal(back.view(torch.int32), nan.view(torch.int32))  # -0.0 kept


def test_a_record_holds_one_array_and_comes_back_exactly():
    tensors = mixed_tensors()
    record = records.to_record(tensors)
    assert isinstance(record, ArrayRecord) and list(record) == [records.PAYLOAD]
    assert_same(records.from_record(record), tensors)


def test_a_small_message_is_three_objects_and_the_shared_models_one_more(task_identity):
    models = {"cluster.0.0": torch.randn(10, 8), "cluster.1.0": torch.randn(10, 8)}
    own = {"clients": torch.tensor([0, 4]), "round": torch.tensor(3)}
    content = records.pack({"config": own}, records.share({"globals": models}))
    assert set(content) == {records.SHARED, records.PAYLOAD}
    assert all(isinstance(record, ConfigRecord) for record in content.values())
    message = Message(content, 1, "train")
    assert len(get_all_nested_objects(message)) == 4  # message, record dict, two records
    unpacked = records.unpack(content)
    assert_same(unpacked["globals"], models)
    assert_same(unpacked["config"], own)
    alone = Message(records.pack({"config": own}), 1, "train")
    assert len(get_all_nested_objects(alone)) == 3


def test_two_nodes_messages_share_the_models_object(task_identity):
    models = {"cluster.0.0": torch.randn(6, 6)}
    first = Message(
        records.pack({"config": {"c": torch.tensor([0])}}, records.share({"globals": models})), 1, "train"
    )
    second = Message(
        records.pack({"config": {"c": torch.tensor([1])}}, records.share({"globals": models})), 2, "train"
    )
    one, two = get_all_nested_objects(first), get_all_nested_objects(second)
    assert len(set(one) & set(two)) == 1  # the models' record: Flower pushes it once for both


def test_a_payload_above_flowers_chunk_size_travels_as_a_chunked_array(task_identity):
    big = {"w": torch.zeros(FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE // 4 + 1)}
    content = records.pack({"globals": big})
    assert isinstance(content[records.PAYLOAD], ArrayRecord)
    objects = get_all_nested_objects(Message(content, 1, "train"))
    assert 6 <= len(objects) <= 8  # message, record dict, record, array, and its chunks (5 MB each)
    assert_same(records.unpack(content)["globals"], big)
