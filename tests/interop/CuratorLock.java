// Interop peer for zkgate integration tests: drives an Apache Curator
// InterProcessMutex (or one side of an InterProcessReadWriteLock, or an
// InterProcessMultiLock over several mutexes) through a line protocol on stdin/stdout.
//
//   java -cp "$(tests/interop/classpath.sh)" CuratorLock <connectString> <lockPath> [mutex|read|write|multi]
//
// For `multi`, <lockPath> lists the mutexes' paths separated by commas.
//
// stdout (one line each, flushed):
//   READY                once the client is connected
//   ACQUIRED | TIMEOUT   reply to "acquire <millis>"
//   RELEASED             reply to "release"
//   ERROR <message>      any exception while handling a command
// stdin: "acquire <millis>", "release", "quit" (EOF behaves like quit).
//
// Only protocol lines are written to the real stdout; System.out is redirected
// to stderr so that no library chatter can corrupt the protocol.
//
// With ZKGATE_PEER_DIGEST=user:password in the environment the client
// authenticates with that digest and creates its znodes with ACL creator-all,
// as a Curator service sharing locks with `zkgate serve --zookeeper-auth` must.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.api.ACLProvider;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMultiLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.data.ACL;

public class CuratorLock {
    private static PrintStream proto;

    private static void say(String line) {
        proto.println(line);
        proto.flush();
    }

    private static String describe(Throwable t) {
        String msg = t.getMessage();
        String s = t.getClass().getName() + (msg == null ? "" : ": " + msg);
        return s.replace('\r', ' ').replace('\n', ' ');
    }

    public static void main(String[] args) {
        proto = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);

        if (args.length != 2 && args.length != 3) {
            say("ERROR usage: CuratorLock <connectString> <lockPath> [mutex|read|write|multi]");
            System.exit(1);
        }
        String connectString = args[0];
        String lockPath = args[1];
        String kind = args.length == 3 ? args[2] : "mutex";

        CuratorFramework client;
        InterProcessLock mutex;
        try {
            CuratorFrameworkFactory.Builder builder = CuratorFrameworkFactory.builder()
                    .connectString(connectString)
                    .sessionTimeoutMs(10_000)
                    .connectionTimeoutMs(10_000)
                    .retryPolicy(new ExponentialBackoffRetry(200, 5));
            String digest = System.getenv("ZKGATE_PEER_DIGEST");
            if (digest != null) {
                builder.authorization("digest", digest.getBytes(StandardCharsets.UTF_8))
                        .aclProvider(new ACLProvider() {
                            @Override
                            public List<ACL> getDefaultAcl() {
                                return ZooDefs.Ids.CREATOR_ALL_ACL;
                            }

                            @Override
                            public List<ACL> getAclForPath(String path) {
                                return ZooDefs.Ids.CREATOR_ALL_ACL;
                            }
                        });
            }
            client = builder.build();
            client.start();
            if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
                say("ERROR could not connect to " + connectString + " within 30s");
                client.close();
                System.exit(1);
            }
            if (kind.equals("mutex")) {
                mutex = new InterProcessMutex(client, lockPath);
            } else if (kind.equals("multi")) {
                mutex = new InterProcessMultiLock(client, Arrays.asList(lockPath.split(",")));
            } else {
                InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, lockPath);
                mutex = kind.equals("read") ? rw.readLock() : rw.writeLock();
            }
        } catch (Throwable t) {
            say("ERROR " + describe(t));
            System.exit(1);
            return;
        }
        say("READY");

        try (BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                line = line.trim();
                if (line.isEmpty()) {
                    continue;
                }
                String[] parts = line.split("\\s+");
                try {
                    switch (parts[0]) {
                        case "acquire": {
                            if (parts.length != 2) {
                                say("ERROR usage: acquire <millis>");
                                break;
                            }
                            long millis = Long.parseLong(parts[1]);
                            boolean ok = mutex.acquire(millis, TimeUnit.MILLISECONDS);
                            say(ok ? "ACQUIRED" : "TIMEOUT");
                            break;
                        }
                        case "release":
                            mutex.release();
                            say("RELEASED");
                            break;
                        case "quit":
                            client.close();
                            System.exit(0);
                            break;
                        default:
                            say("ERROR unknown command: " + parts[0]);
                    }
                } catch (Throwable t) {
                    say("ERROR " + describe(t));
                }
            }
        } catch (Throwable t) {
            System.err.println("stdin failure: " + describe(t));
        }
        client.close();
        System.exit(0);
    }
}
