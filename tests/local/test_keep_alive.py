"""The local cloud's werkzeug servers keep a connection for the next request (jobplane.local.keep_alive): bodies of
each framing read whole, HEAD's length kept without a body, an application error a 500 that ends the connection;
and moto's server, as the local cloud runs it, answers S3 requests on one connection.

They also count what changed in them (jobplane.local.changes): moto's server and the GCS fake count each write,
delete and changing call by area once it is made; a pass of the trigger loop lists only the folders whose counts moved
since the last pass that completed, so an idle cloud lists nothing, and a write it has not delivered is listed again
at the next pass, whenever it landed. An idle cloud's scheduled functions run less often: they would find what they
found last time."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from werkzeug.serving import WSGIRequestHandler, make_server

from jobplane.clouds.s3 import S3Store
from jobplane.local.changes import ANY, PATH, Changes, HttpCounts, Watch, object_area
from jobplane.local.cloud import ServiceProcess
from jobplane.local.fake_gcs import FakeGcsServer
from jobplane.local.keep_alive import keep_alive
from jobplane.local.triggers import IDLE_SCHEDULE, Functions, TriggerLoop
from jobplane.model import keys
from jobplane.store.registry import Registry


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """Says the method and the body it read; /boom raises; HEAD answers the length a GET would have."""
    if environ["PATH_INFO"] == "/boom":
        raise RuntimeError("boom")
    body = environ["wsgi.input"].read()
    answer = f"{environ['REQUEST_METHOD']} {len(body)} {body[:8].decode()}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(answer)))])
    return [] if environ["REQUEST_METHOD"] == "HEAD" else [answer]


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    srv = make_server("127.0.0.1", 0, app, threaded=True, request_handler=keep_alive(WSGIRequestHandler))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10)


def test_one_connection_carries_requests_of_every_framing(server: tuple[str, int]) -> None:
    conn = http.client.HTTPConnection(*server, timeout=10)
    try:
        conn.request("PUT", "/a", body=b"x" * 100_000, headers={"Expect": "100-continue"})
        first = conn.sock
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"PUT 100000 xxxxxxxx")
        conn.request("POST", "/b", body=iter([b"chunk-one", b"chunk-two"]))  # an iterator: sent chunked
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"POST 18 chunk-on")
        conn.request("HEAD", "/c")
        r = conn.getresponse()
        assert (r.status, r.getheader("Content-Length"), r.read()) == (200, "7", b"")  # "HEAD 0 "
        conn.request("GET", "/d")
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"GET 0 ")
        assert conn.sock is first  # never reconnected
        conn.request("GET", "/boom")
        r = conn.getresponse()
        assert (r.status, r.getheader("Connection"), r.read()) == (500, "close", b"Internal Server Error")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    server = ServiceProcess("jobplane.local.moto_server").start(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


def test_moto_s_server_answers_s3_on_one_connection(moto: ServiceProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", moto.port, timeout=10)
    try:
        answers = []
        for method, path, body in [("PUT", "/keep", b""), ("PUT", "/keep/k", b"value"), ("GET", "/keep/k", None),
                                   ("HEAD", "/keep/k", None), ("GET", "/keep?list-type=2", None),
                                   ("DELETE", "/keep/k", None), ("GET", "/keep/k", None)]:
            signed = AWSRequest(method, moto.url + path, data=body or b"")
            SigV4Auth(Credentials("k", "s"), "s3", "us-east-1").add_auth(signed)  # as boto3 signs
            conn.request(method, path, body=body, headers=dict(signed.headers))
            sock = conn.sock
            r = conn.getresponse()
            answers.append((r.status, r.read()[:5], r.getheader("Content-Length") if method == "HEAD" else None))
            assert conn.sock is sock and not r.will_close, (method, path)  # werkzeug's own closed every one
        assert [a[0] for a in answers] == [200, 200, 200, 200, 200, 204, 404]
        assert answers[2][1] == b"value" and answers[3][2] == "5" and answers[4][1] == b"<?xml"
    finally:
        conn.close()


def test_a_look_says_which_areas_moved_since_the_last_completed_pass() -> None:
    changes = Changes()
    watch = Watch(changes.counts)
    first = watch.look()
    assert first.changed("b/queue") and first.changed("ec2")  # nothing consumed yet: everything may have changed
    first.done()
    assert not watch.look().changed("b/queue")
    changes.note("b/queue")
    look = watch.look()
    assert look.changed("b/queue") and not look.changed("b/jobs") and not look.changed("ec2")
    assert not look.changed("other/queue")
    look.done()
    changes.note(object_area("b", ""))  # the whole bucket (a bucket-level call)
    look = watch.look()
    assert look.changed("b/queue") and look.changed("b/jobs") and not look.changed("other/queue")
    look.done()
    changes.note(ANY)  # a change nobody could place
    look = watch.look()
    assert look.changed("other/queue") and look.changed("ec2")


def test_a_pass_that_did_not_complete_consumes_nothing_and_a_change_during_a_pass_is_seen_next() -> None:
    changes = Changes()
    watch = Watch(changes.counts)
    watch.look().done()
    changes.note("b/queue")
    watch.look()  # this pass failed: never done
    look = watch.look()
    assert look.changed("b/queue")
    changes.note("b/queue")  # after the counts were read, while the pass lists
    look.done()
    assert watch.look().changed("b/queue")


def test_counts_that_cannot_be_read_mean_everything_changed() -> None:
    def unreachable() -> dict[str, int]:
        raise ConnectionRefusedError

    watch = Watch(unreachable)
    watch.seen = {}
    look = watch.look()
    assert look.changed("b/queue") and look.changed("ec2")
    look.done()
    assert watch.seen == {}


def test_an_area_is_a_top_level_folder() -> None:
    assert object_area("b", "queue/") == "b/queue"
    assert object_area("b", "jobs/j1/attempts/1/nodes/0/exit.json") == "b/jobs"
    assert object_area("b", "queue") == f"b/{ANY}"  # not a folder: any key of the bucket may start so


class Delivered(Functions):
    """Records what the loop delivers (the functions themselves are not under test here)."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[tuple[str, str]] = []

    def object_created(self, area: str, key: str, size: int) -> None:
        self.created.append((area, key))


class Listed(Registry):
    """The registry, counting the prefixes it lists."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listed: list[str] = []

    def listing(self, prefix: str, page_size: int = 1000) -> Iterator[tuple[str, Any, int]]:
        self.listed.append(prefix)
        return super().listing(prefix, page_size)


def client(moto: ServiceProcess, service: str) -> Any:
    return boto3.client(service, endpoint_url=moto.url, region_name="us-east-1")  # type: ignore[call-overload]


def test_moto_counts_what_changes_and_the_loop_lists_only_that(moto: ServiceProcess) -> None:
    s3 = client(moto, "s3")
    s3.create_bucket(Bucket="reg")
    reg = Listed(S3Store("reg", s3))
    functions = Delivered()
    loop = TriggerLoop(reg, functions, schedule=3600, bucket="reg")
    loop.last_cron = float("inf")  # no scheduled runs: the functions are not here
    watch = Watch(HttpCounts(moto.url))

    def tick() -> list[str]:
        reg.listed.clear()
        look = watch.look()
        loop.tick(look)
        look.done()
        return list(reg.listed)

    assert tick() == [keys.QUEUE, keys.CANCELS, keys.PREEMPTED, keys.ACTIVE]  # the first pass lists everything
    assert tick() == []  # idle: nothing listed
    s3.put_object(Bucket="reg", Key="queue/j1.yaml", Body=b"name: j1")
    s3.get_object(Bucket="reg", Key="queue/j1.yaml")  # a read changes nothing
    assert tick() == [keys.QUEUE] and functions.created == [("queue", "queue/j1.yaml")]
    s3.put_object(Bucket="reg", Key="active/j1/RUNNING.1", Body=b"")
    assert tick() == [keys.ACTIVE, keys.attempt_prefix("j1", 1)]
    s3.put_object(Bucket="reg", Key="heartbeats/j1/1/0", Body=b"")  # no folder the loop watches
    assert tick() == []
    exit_key = keys.attempt_prefix("j1", 1) + "nodes/0/exit.json"
    look = watch.look()
    loop.tick(look)  # lists nothing ...
    s3.put_object(Bucket="reg", Key=exit_key, Body=b"{}")  # ... while an exit report lands
    look.done()
    assert tick() == [keys.attempt_prefix("j1", 1)] and functions.created[-1] == ("exits", exit_key)
    early = keys.attempt_prefix("j2", 1) + "boot-failure.json"
    s3.put_object(Bucket="reg", Key=early, Body=b"{}")  # before its attempt is live: nothing lists it yet ...
    assert tick() == [keys.attempt_prefix("j1", 1)]
    s3.put_object(Bucket="reg", Key="active/j2/LAUNCHING.1", Body=b"")  # ... until it is, its folder unchanged
    assert tick() == [keys.ACTIVE, keys.attempt_prefix("j2", 1)] and functions.created[-1] == ("exits", early)
    s3.delete_objects(Bucket="reg", Delete={"Objects": [{"Key": "heartbeats/j1/1/0"}]})  # keys in the body
    assert tick() == [keys.QUEUE, keys.CANCELS, keys.PREEMPTED, keys.ACTIVE, keys.attempt_prefix("j1", 1),
                      keys.attempt_prefix("j2", 1)]
    assert len(functions.created) == 3  # nothing delivered twice


class Scheduled(Delivered):
    """One scheduled function, counted by Functions.invoke."""

    names = scheduled = ("cron",)

    def call(self, name: str, event: Any) -> Any:
        return None

    def scheduled_event(self, name: str) -> Any:
        return {}


def test_an_idle_cloud_runs_its_schedules_less_often_until_anything_could_move(moto: ServiceProcess) -> None:
    s3 = client(moto, "s3")
    s3.create_bucket(Bucket="idle")
    now = [1000.0]
    functions = Scheduled()
    loop = TriggerLoop(Registry(S3Store("idle", s3)), functions, schedule=2, bucket="idle", clock=lambda: now[0])
    watch = Watch(HttpCounts(moto.url))

    def runs(seconds: int, busy: bool = False) -> int:
        """The scheduled runs in that many ticks, a second apart."""
        before = functions.invocations.get("cron", 0)
        for _ in range(seconds):
            look = watch.look()
            loop.tick(look, busy=busy)
            look.done()
            now[0] += 1
        return functions.invocations.get("cron", 0) - before

    assert IDLE_SCHEDULE == 15
    assert runs(30) == 2  # nothing anywhere: at 1000 and 1015
    assert runs(30, busy=True) == 15  # a VM: every 2 s
    s3.put_object(Bucket="idle", Key="queue/j1.yaml", Body=b"name: j1")  # a drop a run may retry
    assert runs(10) == 5
    s3.delete_object(Bucket="idle", Key="queue/j1.yaml")
    assert runs(30) == 2  # the delete is a change (one run at 2 s), then idle again: 15 s
    s3.put_object(Bucket="idle", Key="active/j2/WAITING_CAPACITY.1", Body=b"")  # a capacity wait: time moves it on
    assert runs(10) == 5
    s3.delete_object(Bucket="idle", Key="active/j2/WAITING_CAPACITY.1")
    runs(5)
    s3.put_object(Bucket="idle", Key="config/policy.yaml", Body=b"{}")  # a write anywhere: the next run is at 2 s
    assert runs(4) == 1


def test_moto_counts_ec2_and_notification_calls_that_change_something(moto: ServiceProcess) -> None:
    def counts() -> dict[str, int]:
        with urllib.request.urlopen(moto.url + PATH, timeout=10) as answer:
            return dict(json.load(answer))

    ec2, sns = client(moto, "ec2"), client(moto, "sns")
    before = counts()
    ec2.describe_instances()
    sns.list_topics()
    assert counts() == before  # reads
    ec2.create_vpc(CidrBlock="10.9.0.0/16")
    topic = sns.create_topic(Name="changes")["TopicArn"]
    sns.publish(TopicArn=topic, Message="hello")
    after = counts()
    assert after.get("ec2", 0) == before.get("ec2", 0) + 1 and after.get("sns", 0) == before.get("sns", 0) + 2


def test_the_gcs_fake_counts_writes_and_deletes_by_folder() -> None:
    with FakeGcsServer() as server:
        server.create_bucket("b")
        read = HttpCounts(server.endpoint)
        assert read() == {}

        def call(method: str, path: str, body: bytes | None = None) -> None:
            request = urllib.request.Request(server.endpoint + path, data=body, method=method)
            urllib.request.urlopen(request, timeout=10).close()

        call("POST", "/upload/storage/v1/b/b/o?uploadType=media&name=queue%2Fj1.yaml", b"name: j1")
        call("GET", "/storage/v1/b/b/o?prefix=queue%2F")
        call("POST", "/upload/storage/v1/b/b/o?uploadType=media&name=jobs%2Fj1%2Fjob.json", b"{}")
        call("DELETE", "/storage/v1/b/b/o/queue%2Fj1.yaml")
        assert read() == {"b/queue": 2, "b/jobs": 1}
        server.reset()
        assert read()[ANY] == 1
