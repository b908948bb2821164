"""A GCS JSON API server on 127.0.0.1 for the gs:// tests: gcp-storage-emulator, in memory.

  python tests/gcs_server.py PORT BUCKET

One gap of the emulator (2026.7.19) is filled here: its object downloads carry no
`x-goog-generation` header, which GCS always sends and tensorstore needs (OCDBT reads its
manifest's generation before it commits; without the header it fails with "Malformed
StorageGeneration" as soon as a second commit reads the manifest).
"""

import sys

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download_with_generation(request, response, storage, *args, **kwargs):
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
  except NotFound:
    pass
  return _download(request, response, storage, *args, **kwargs)


def main():
  port, bucket = int(sys.argv[1]), sys.argv[2]
  objects.download = download_with_generation  # objects.get calls it for ?alt=media
  for route in server.HANDLERS:  # the routes hold the handler function itself
    methods = route[-1] if isinstance(route[-1], dict) else None
    for method, handler in (methods or {}).items():
      if handler is _download:
        methods[method] = download_with_generation
  srv = server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
  srv.run()  # until terminated


if __name__ == "__main__":
  main()
