"""The native extension's own promises: which inputs are read in place, the range check
of converted ids (a ValueError naming the position), slots handed back as one buffer, the
GIL released around tree calls."""

import threading
import time
from array import array

import pytest

import radixkv
from radixkv import Cache, SlotBuffer
from radixkv._cache import as_u32

try:
    import numpy as np
except ImportError:  # numpy is optional
    np = None

needs_numpy = pytest.mark.skipif(np is None, reason="numpy not installed")


def test_int32_buffers_are_copied_int64_ones_converted():
    a = array("i", [3, 4, 5])
    got = as_u32(a)
    assert got.n == 3 and got.ptr is None  # copied under the GIL, then read as it is
    del got
    q = array("q", [3, 4, 5])
    got = as_u32(q)
    assert got.n == 3 and got.ptr is None  # converted, not borrowed in place
    with Cache() as c:
        c.insert(q, array("l", [10, 11, 12]))
        assert list(c.match(a)) == [10, 11, 12]
        assert list(c.match(array("H", [3, 4]))) == [10, 11]
        assert list(c.match(memoryview(array("I", [3, 4, 5, 6]))[1:])) == []


@pytest.mark.parametrize("code", ["q", "l", "i"])
def test_out_of_range_ids_name_their_position(code):
    with Cache() as c:
        with pytest.raises(ValueError, match=r"tokens\[2\] = -7 is out of range"):
            c.match(array(code, [1, 2, -7, 4]))
        if code != "i":
            with pytest.raises(ValueError, match=r"slots\[1\] = 4294967296 is out of range"):
                c.insert(array(code, [1, 2]), array(code, [5, 1 << 32]))
        assert c.stats().cached_tokens == 0


def test_python_sequences_name_their_position_too():
    with Cache() as c:
        with pytest.raises(ValueError, match=r"tokens\[1\] = 18446744073709551616"):
            c.match([1, 1 << 64])
        with pytest.raises(TypeError, match=r"tokens\[0\]: expected an integer id, not str"):
            c.match(["a"])
        with pytest.raises(TypeError, match="expected a sequence of integer ids, got float"):
            c.match(1.5)


@needs_numpy
def test_numpy_int64_and_strided_inputs():
    with Cache() as c:
        t = np.arange(100, 164, dtype=np.int64)
        c.insert(t, t + 1000)
        assert np.frombuffer(c.match(t[::-1][::-1]), dtype=np.uint32).tolist() == list(range(1100, 1164))
        assert len(c.match(t[::2])) == 1  # strided: converted, first token only matches
        with pytest.raises(ValueError, match=r"tokens\[3\] = -1 is out of range"):
            c.match(np.array([100, 101, 102, -1], dtype=np.int64))
        with pytest.raises(TypeError, match="not integers"):
            c.match(np.zeros(3, dtype=np.float32))
        with pytest.raises(TypeError, match="2-dimensional"):
            c.match(np.zeros((2, 2), dtype=np.uint32))
        assert as_u32(np.arange(4, dtype=np.int32)).ptr is None  # copied under the GIL


def test_slots_come_back_as_one_buffer():
    with Cache() as c:
        c.insert([1, 2, 3], [7, 8, 9])
        m = c.match([1, 2, 3])
        assert type(m) is SlotBuffer and isinstance(m, array) and m.typecode == "I"
        assert m == [7, 8, 9] and m == (7, 8, 9) and m == array("I", [7, 8, 9]) and m != [7]
        freed = c.evict(10)
        assert type(freed) is SlotBuffer and sorted(freed) == [7, 8, 9]
        assert c.evict(10) == []


def test_array_interface_objects_are_read():
    class Wrapped:
        def __init__(self, a):
            self.a = a
            addr, _ = a.buffer_info()
            self.__array_interface__ = {
                "version": 3,
                "shape": (len(a),),
                "typestr": "<u4",
                "data": (addr, False),
                "strides": None,
            }

    a = array("I", [5, 6, 7])
    with Cache() as c:
        c.insert(Wrapped(a), Wrapped(array("I", [1, 2, 3])))
        assert list(c.match([5, 6, 7])) == [1, 2, 3]


def test_the_gil_is_released_during_a_long_call():
    # While one thread is inside a long native call, another thread's Python code runs.
    with Cache() as c:
        n = 1 << 21
        toks = array("I", range(n))
        c.insert(toks, toks)
        ticks = []
        done = threading.Event()

        def tick():
            while not done.is_set():
                ticks.append(time.perf_counter())
                time.sleep(0)

        t = threading.Thread(target=tick)
        t.start()
        time.sleep(0.01)
        before = len(ticks)
        t0 = time.perf_counter()
        for _ in range(20):
            c.match_len(toks)
        t1 = time.perf_counter()
        done.set()
        t.join()
        inside = [x for x in ticks[before:] if t0 < x < t1]
        assert inside, "the other thread never ran while the matches were in the library"


def test_version_and_extension():
    assert radixkv.version() == "0.1.0"
    assert radixkv.library_path().endswith((".so", ".pyd"))


def test_match_len_many_is_match_len_of_each():
    with Cache() as c:
        c.insert([1, 2, 3, 4], [10, 11, 12, 13])
        qs = [[1, 2, 9], array("q", [1, 2, 3, 4, 5]), (7,), []]
        assert c.match_len_many(qs) == [c.match_len(q) for q in qs] == [2, 4, 0, 0]
        assert c.match_len_many(iter(qs), ns="other") == [0, 0, 0, 0]
        with pytest.raises(ValueError, match=r"queries\[1\]: tokens\[0\] = -1"):
            c.match_len_many([[1], [-1]])
