"""The client's keys agree with every vector of KEYS.md."""

import json
import os
import unittest

from once_client import JSON_NULL, Intent

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "testdata", "keys", "vectors.json")


class KeysTest(unittest.TestCase):
    def test_vectors(self):
        with open(VECTORS) as f:
            vectors = json.load(f)["vectors"]
        self.assertGreater(len(vectors), 10)
        for v in vectors:
            i, p = v["intent"], v["intent"]["payload"]
            payload, raw = None, None
            if p is not None and "raw_hex" in p:
                raw = bytes.fromhex(p["raw_hex"])
            elif p is not None:
                payload = json.loads(p["json"])
                if payload is None:
                    payload = JSON_NULL
            got = Intent(i["run"], i["step"], i["kind"], i["target"], payload, raw, i["payload_in_key"]).keys()
            with self.subTest(v["name"]):
                self.assertEqual(got, (v["key"], v["fingerprint"]))


if __name__ == "__main__":
    unittest.main()
