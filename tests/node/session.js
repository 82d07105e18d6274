// A node-postgres session, as an application runs one: connect, statements with
// parameters (which node-postgres sends untyped, as text), an error, its own
// introspection. Prints one JSON line per statement: its rows or its SQLSTATE.
// usage: node session.js '{"host": ..., "port": ..., "user": ..., "database": ...}' STATEMENTS.json
const fs = require('fs');
const { Client } = require('pg');

async function main() {
  const config = JSON.parse(process.argv[2]);
  const statements = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
  const client = new Client({ ...config, connectionTimeoutMillis: 10000, query_timeout: 30000 });
  await client.connect();
  const version = require('pg/package.json').version;
  console.log(JSON.stringify({ version }));
  for (const [text, values] of statements) {
    try {
      const result = await client.query({ text, values, rowMode: 'array' });
      console.log(JSON.stringify({ text, rows: result.rows, command: result.command }));
    } catch (error) {
      console.log(JSON.stringify({ text, error: error.code || String(error) }));
    }
  }
  await client.end();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
