"""Every request named by its S3 operation, from one table; real bytes counted for each answer.

The routing table is checked as data (method, path, query → the S3 API
Reference name). Then a Hoard in front of moto answers a mix of served,
forwarded, error, listing and admin requests, and its metrics and JSON access
log must name each one and count the bytes its answer really carried. CORS
preflights (OPTIONS) reach the origin unsigned by the client, as S3 takes them.
"""

from __future__ import annotations

import uuid

import pytest
import requests

from gateway.s3.routing import route
from tests.conftest import ORIGIN_KEY, ORIGIN_SECRET, moto_origin
from tests.harness import HoardProcess, logged, metric
from tests.inprocess import threaded_app
from tests.rawhttp import send, signed_send


@pytest.mark.parametrize(
    ("method", "path", "query", "copy", "expected", "served"),
    [
        ("GET", "/", "", False, "ListBuckets", True),
        ("GET", "/b", "", False, "ListObjects", True),
        ("GET", "/b", "list-type=2", False, "ListObjectsV2", True),
        ("GET", "/b", "location", False, "GetBucketLocation", True),
        ("GET", "/b", "versions", False, "ListObjectVersions", False),
        ("GET", "/b", "uploads", False, "ListMultipartUploads", False),
        ("PUT", "/b", "tagging", False, "PutBucketTagging", False),
        ("DELETE", "/b", "cors", False, "DeleteBucketCors", False),
        ("GET", "/b", "lifecycle", False, "GetBucketLifecycleConfiguration", False),
        ("GET", "/b", "inventory", False, "ListBucketInventoryConfigurations", False),
        ("GET", "/b", "inventory&id=x", False, "GetBucketInventoryConfiguration", False),
        ("PUT", "/b", "", False, "CreateBucket", False),
        ("DELETE", "/b", "", False, "DeleteBucket", False),
        ("POST", "/b", "delete", False, "DeleteObjects", False),
        ("OPTIONS", "/b/k", "", False, "PreflightRequest", False),
        ("GET", "/b/k", "", False, "GetObject", True),
        ("GET", "/b/k", "partNumber=1", False, "GetObject", False),
        ("HEAD", "/b/k", "versionId=v", False, "HeadObject", False),
        ("GET", "/b/k", "acl", False, "GetObjectAcl", False),
        ("PUT", "/b/k", "tagging", False, "PutObjectTagging", False),
        ("PUT", "/b/k", "", True, "CopyObject", False),
        ("PUT", "/b/k", "partNumber=1&uploadId=u", True, "UploadPartCopy", False),
        ("POST", "/b/k", "uploads", False, "CreateMultipartUpload", False),
        ("POST", "/b/k", "uploadId=u", False, "CompleteMultipartUpload", False),
        ("GET", "/b/k", "uploadId=u", False, "ListParts", False),
        ("POST", "/b/k", "restore", False, "RestoreObject", False),
        # a sub-resource without an operation for the method: the origin answers it
        ("HEAD", "/b/k", "acl", False, "HeadObject", False),
    ],
)
def test_each_request_has_its_s3_name(method, path, query, copy, expected, served) -> None:
    params = dict(p.partition("=")[::2] for p in query.split("&") if p)
    found = route(method, "127.0.0.1:9000", path, params, ["localhost"], copy)
    assert (found.operation, found.served) == (expected, served)


@pytest.fixture(scope="module")
def hoard(tmp_path_factory, moto_endpoint):
    config = {
        "origins": {"moto": {"type": "s3", "endpoint": moto_endpoint, "access_key": ORIGIN_KEY,
                             "secret_key": ORIGIN_SECRET, "addressing_style": "path"}},
        "default_origin": "moto",
        "log_format": "json",
    }  # fmt: skip
    node = HoardProcess(tmp_path_factory.mktemp("hoard-ops"), config).start()
    yield node
    node.stop()


def test_metrics_and_access_log_name_operations_and_count_real_bytes(
    hoard, origin_client, bucket
) -> None:
    origin_client.put_object(Bucket=bucket, Key="k", Body=b"twelve bytes")
    cases = [
        ("GET", f"/{bucket}/k", "GetObject", 200),
        ("GET", f"/{bucket}/k?acl", "GetObjectAcl", 200),
        ("GET", f"/{bucket}?list-type=2", "ListObjectsV2", 200),
        ("GET", f"/{bucket}/absent", "GetObject", 404),
        ("GET", f"/{bucket}?versioning", "GetBucketVersioning", 200),
        ("DELETE", f"/{bucket}?tagging", "DeleteBucketTagging", 204),
        ("HEAD", f"/{bucket}/k", "HeadObject", 200),
    ]
    for method, target, operation, status in cases:
        before = metric(hoard.endpoint, f'hoard_response_bytes_total{{operation="{operation}"}}')
        answer = signed_send(hoard.port, method, target)
        assert answer.status == status, (target, answer.body)
        line = logged(hoard, answer.headers["x-amz-request-id"])
        body = 0 if method == "HEAD" else len(answer.body)
        assert (line["operation"], line["status"], line["bytes"]) == (operation, status, body)
        counted = metric(hoard.endpoint, f'hoard_response_bytes_total{{operation="{operation}"}}')
        assert counted - before == body, operation
        assert metric(hoard.endpoint, f'hoard_requests_total{{operation="{operation}"}}') >= 1
    stats = requests.get(f"{hoard.endpoint}/_hoard/stats", timeout=10)  # unsigned: refused
    assert stats.status_code == 403
    assert logged(hoard, stats.headers["x-amz-request-id"])["bytes"] == len(stats.content)


def test_a_cors_preflight_is_the_origins_answer(hoard, origin_client, bucket) -> None:
    preflight = {"Host": "127.0.0.1", "Origin": "https://app.example",
                 "Access-Control-Request-Method": "GET"}  # fmt: skip
    refused = send(hoard.port, "OPTIONS", f"/{bucket}/k", headers=preflight)  # no CORS rules
    direct = send(_port(origin_client), "OPTIONS", f"/{bucket}/k", headers=preflight)
    assert (refused.status, refused.body) == (direct.status, direct.body)
    origin_client.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [
        {"AllowedOrigins": ["https://app.example"], "AllowedMethods": ["GET"]}]})  # fmt: skip
    allowed = send(hoard.port, "OPTIONS", f"/{bucket}/k", headers=preflight)
    assert allowed.status == 200
    assert allowed.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "GET" in allowed.headers["Access-Control-Allow-Methods"]


def _port(client) -> int:
    return int(client.meta.endpoint_url.rsplit(":", 1)[1])


def test_a_preflight_to_a_directory_bucket_is_refused_as_s3_refuses_it(tmp_path) -> None:
    (tmp_path / "data" / "pics").mkdir(parents=True)
    config = {"origins": {"d": {"type": "posix", "path": str(tmp_path / "data")}},
              "default_origin": "d"}  # fmt: skip
    with threaded_app(tmp_path, config) as node:
        preflight = {"Host": "127.0.0.1", "Origin": "https://app.example",
                     "Access-Control-Request-Method": "GET"}  # fmt: skip
        refused = send(node.port, "OPTIONS", "/pics/a.jpg", headers=preflight)
        assert refused.status == 403 and b"<Code>CORSResponse</Code>" in refused.body
        missing = send(node.port, "OPTIONS", f"/gone-{uuid.uuid4().hex[:6]}/a", headers=preflight)
        assert missing.status == 404 and b"<Code>NoSuchBucket</Code>" in missing.body


def test_list_buckets_pages_by_prefix_and_token(tmp_path) -> None:
    # Paging is Hoard's own whatever the origin, so a directory is origin enough.
    names = ["lb-a", "lb-b", "lb-c"]
    for name in [*names, "other-bucket"]:
        (tmp_path / "data" / name).mkdir(parents=True)
    config = {"origins": {"d": {"type": "posix", "path": str(tmp_path / "data")}},
              "default_origin": "d"}  # fmt: skip
    with threaded_app(tmp_path, config) as node:
        client, seen, params = node.client(), [], {"Prefix": "lb-", "MaxBuckets": 2}
        while True:
            page = client.list_buckets(**params)
            assert page["Prefix"] == "lb-" and len(page["Buckets"]) <= 2
            seen += [b["Name"] for b in page["Buckets"]]
            if "ContinuationToken" not in page:
                break
            params["ContinuationToken"] = page["ContinuationToken"]
        assert seen == names
        assert len(client.list_buckets()["Buckets"]) == 4
        for bad in ("0", "10001", "x"):
            answer = signed_send(node.port, "GET", f"/?max-buckets={bad}")
            assert answer.status == 400 and b"<Code>InvalidArgument</Code>" in answer.body


def test_a_preflight_takes_only_its_cors_headers_to_the_origin(
    tmp_path, proxy, origin_client, bucket
) -> None:
    """A preflight is unsigned, and its forward goes out under Hoard's credentials: what S3
    would refuse is refused here, and nothing but the preflight itself (no query, no other
    client header) reaches the origin."""
    config = {"origins": {"moto": moto_origin(proxy)}, "default_origin": "moto"}
    with threaded_app(tmp_path, config) as node:
        no_origin = send(node.port, "OPTIONS", f"/{bucket}/k",
                         headers={"Host": "127.0.0.1", "Access-Control-Request-Method": "GET"})  # fmt: skip
        no_method = send(node.port, "OPTIONS", f"/{bucket}/k",
                         headers={"Host": "127.0.0.1", "Origin": "https://app.example"})  # fmt: skip
        for refused in (no_origin, no_method):
            assert refused.status == 400, refused.body
            assert b"<Code>BadRequest</Code>" in refused.body
            assert refused.headers["x-amz-request-id"].encode() in refused.body
        assert "OPTIONS" not in {method for method, _, _ in proxy.seen}, "refused at Hoard"
        preflight = {"Host": "127.0.0.1", "Origin": "https://app.example",
                     "Access-Control-Request-Method": "GET", "X-Amz-Acl": "public-read"}  # fmt: skip
        answer = send(node.port, "OPTIONS", f"/{bucket}/k?acl", headers=preflight)
        direct = send(_port(origin_client), "OPTIONS", f"/{bucket}/k", headers=preflight)
        assert (answer.status, answer.body) == (direct.status, direct.body)
        forwarded = [(path, headers) for method, path, headers in proxy.seen if method == "OPTIONS"]
        assert [path for path, _ in forwarded] == [f"/{bucket}/k"]
        assert forwarded[0][1]["Origin"] == "https://app.example"
        assert "X-Amz-Acl" not in forwarded[0][1]
