"""S3Backend: blobs in an S3-compatible bucket (MinIO, AWS S3, Ceph RGW) through ``minio``.

Streaming puts hold at most ``(parallel_uploads + 1) * part_size`` bytes in memory whatever
the blob size: the chunk iterator is read one part at a time by ``Minio.put_object`` (length
unknown, multipart above one part). S3 allows 10,000 parts, so the largest blob is
``part_size * 10_000`` (156 GiB at the default 16 MiB).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from gantry.core import ConfigError
from gantry.storage.backends import Backend
from gantry.storage.errors import BackendUnavailable, ObjectNotFound
from gantry.storage.naming import check_blob_name

MIN_PART_SIZE = 5 * 1024 * 1024
DEFAULT_PART_SIZE = 16 * 1024 * 1024
READ_PIECE = 1024 * 1024
_MISSING = ("NoSuchKey", "NoSuchObject", "ResourceNotFound")
_REFUSED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")


class _IterReader:
    """A minimal binary file over an iterator of byte strings; ``read(n)`` fills n bytes."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._rest = memoryview(b"")
        self.total = 0

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes | memoryview] = []
        want = size if size >= 0 else 1 << 62
        while want > 0:
            if not self._rest:
                nxt = next(self._chunks, None)
                if nxt is None:
                    break
                self._rest = memoryview(nxt)
            piece, self._rest = self._rest[:want], self._rest[want:]
            parts.append(piece)
            want -= len(piece)
        data = b"".join(parts)
        self.total += len(data)
        return data


class S3Backend(Backend):
    """Blobs as objects in one bucket of an S3-compatible service.

    ``endpoint`` is ``host:port`` (an ``http://`` or ``https://`` prefix sets ``secure``).
    The bucket is created when missing if ``create_bucket``. Network failures raise
    :class:`BackendUnavailable`; refused credentials raise :class:`gantry.core.ConfigError`.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        bucket: str = "gantry",
        access_key: str | None = None,
        secret_key: str | None = None,
        secure: bool = True,
        region: str | None = None,
        create_bucket: bool = True,
        part_size: int = DEFAULT_PART_SIZE,
        parallel_uploads: int = 2,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 300.0,
        retries: int = 3,
    ) -> None:
        import certifi
        import urllib3
        from minio import Minio
        from minio.error import MinioException

        if endpoint.startswith(("http://", "https://")):
            secure = endpoint.startswith("https://")
            endpoint = endpoint.split("://", 1)[1].rstrip("/")
        if part_size < MIN_PART_SIZE:
            raise ConfigError(
                f"S3 part size {part_size} is below the S3 minimum of {MIN_PART_SIZE} bytes",
                hint="use at least 5 MiB; the largest blob is part_size * 10,000",
            )
        self.endpoint = endpoint
        self.bucket = bucket
        self.part_size = part_size
        self.parallel_uploads = max(1, parallel_uploads)
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s),
            maxsize=max(10, self.parallel_uploads * 2),
            cert_reqs="CERT_REQUIRED",
            ca_certs=certifi.where(),
            retries=urllib3.Retry(
                total=retries, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]
            ),
        )
        self._failures: tuple[type[Exception], ...] = (
            MinioException,
            urllib3.exceptions.HTTPError,
            OSError,
        )
        self._client: Any = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            secure=secure,
            region=region,
            http_client=http,
        )
        if create_bucket:
            self._call("create bucket", self._ensure_bucket, region)

    def describe(self) -> str:
        """``S3 bucket <bucket> at <endpoint>``."""
        return f"S3 bucket {self.bucket!r} at {self.endpoint}"

    def _ensure_bucket(self, region: str | None) -> None:
        from minio.error import S3Error

        if self._client.bucket_exists(self.bucket):
            return
        try:
            self._client.make_bucket(self.bucket, location=region)
        except S3Error as exc:
            if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def _call(self, action: str, fn: Any, *args: Any, name: str | None = None, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except self._failures as exc:
            raise self._error(exc, action, name) from None

    def _error(self, exc: Exception, action: str, name: str | None) -> Exception:
        code = getattr(exc, "code", None)
        if code in _MISSING and name is not None:
            return ObjectNotFound(name)
        if code in _REFUSED:
            return ConfigError(
                f"{self.describe()} refused to {action}: {code}",
                hint="check the access key, secret key and the bucket policy",
            )
        if code == "NoSuchBucket":
            return ConfigError(
                f"{self.describe()} does not exist",
                hint="create the bucket, or enable create_bucket in the storage settings",
            )
        return BackendUnavailable(self.describe(), f"cannot {action}: {exc}")

    def put_stream(self, name: str, chunks: Iterable[bytes]) -> int:
        """Upload in parts of ``part_size``; a failing iterator aborts the multipart upload."""
        reader = _IterReader(chunks)
        self._call(
            "upload",
            self._client.put_object,
            self.bucket,
            check_blob_name(name),
            reader,
            length=-1,
            part_size=self.part_size,
            num_parallel_uploads=self.parallel_uploads,
            name=name,
        )
        return reader.total

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        """One ranged GET."""
        if length <= 0:
            return b""
        response = self._get(name, offset, length)
        if response is None:
            return b""
        try:
            return bytes(self._call("read", response.read, name=name))
        finally:
            response.close()
            response.release_conn()

    def get_stream(self, name: str, offset: int = 0) -> Iterator[bytes]:
        """One streaming GET from ``offset``, read in 1 MiB pieces."""
        response = self._get(name, offset, 0)
        if response is None:
            return
        try:
            pieces = response.stream(READ_PIECE)
            while True:
                piece = self._call("read", next, pieces, None, name=name)
                if piece is None:
                    break
                yield piece
        finally:
            response.close()
            response.release_conn()

    def _get(self, name: str, offset: int, length: int) -> Any:
        from minio.error import S3Error

        check_blob_name(name)
        try:
            return self._client.get_object(self.bucket, name, offset=offset, length=length)
        except S3Error as exc:
            if exc.code == "InvalidRange":  # offset at or past the end
                return None
            raise self._error(exc, "read", name) from None
        except self._failures as exc:
            raise self._error(exc, "read", name) from None

    def _stat(self, name: str) -> Any:
        check_blob_name(name)
        return self._call("stat", self._client.stat_object, self.bucket, name, name=name)

    def size(self, name: str) -> int:
        """The object's size from a HEAD request."""
        return int(self._stat(name).size)

    def mtime(self, name: str) -> float:
        """The object's Last-Modified time."""
        return float(self._stat(name).last_modified.timestamp())

    def exists(self, name: str) -> bool:
        """Whether a HEAD request finds the object."""
        try:
            self._stat(name)
        except ObjectNotFound:
            return False
        return True

    def list(self, prefix: str) -> Iterator[str]:
        """A recursive listing; S3 returns keys in ascending UTF-8 order already."""
        objects = self._call(
            "list", self._client.list_objects, self.bucket, prefix=prefix, recursive=True
        )
        while True:
            obj = self._call("list", next, objects, None)
            if obj is None:
                return
            yield str(obj.object_name)

    def delete(self, name: str) -> bool:
        """HEAD then DELETE (S3's DELETE does not say whether the object existed)."""
        if not self.exists(name):
            return False
        self._call("delete", self._client.remove_object, self.bucket, name, name=name)
        return True


__all__ = ["DEFAULT_PART_SIZE", "MIN_PART_SIZE", "S3Backend"]
