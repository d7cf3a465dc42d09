// A calling application's check of a delivery with the official Standard Webhooks library:
// reads {"secret", "headers", "body"} as JSON on standard input, prints the verified payload
// as JSON, or the library's error and exits 1.
import { Webhook } from "standardwebhooks";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const { secret, headers, body } = JSON.parse(input);
try {
  const payload = new Webhook(secret).verify(body, headers);
  process.stdout.write(JSON.stringify(payload) + "\n");
} catch (error) {
  process.stdout.write(JSON.stringify({ error: String(error.message || error) }) + "\n");
  process.exit(1);
}
